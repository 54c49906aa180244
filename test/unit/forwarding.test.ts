// rank/forwarding.ts: an engine's wrappers (its queue in the Web Worker, the page's turns) forward
// the methods of one table the compiler holds to the interface, so none of them can miss a method.
import { describe, expect, it } from 'vitest';
import { ENGINE_METHODS, type EngineApi } from '../../rank/engine.ts';
import { forward, Forwarding, type MethodNames } from '../../rank/forwarding.ts';
import { STAGE_METHODS } from '../../rank/stages.ts';

interface Counter {
  add(n: number): Promise<number>;
  name(): Promise<string>;
  reset?(): Promise<void>;
}

const names: MethodNames<Counter> = { add: true, name: true, reset: true };

function counter(): Counter & { readonly total: number } {
  let total = 0;
  return {
    get total() {
      return total;
    },
    add: (n) => Promise.resolve((total += n)),
    name: () => Promise.resolve('counter'),
    reset: () => {
      total = 0;
      return Promise.resolve();
    },
  };
}

describe('forwarding', () => {
  it('a table of method names must name each method of the interface, optional ones too, and nothing else', () => {
    // @ts-expect-error reset is optional, but a wrapper without it would not forward it
    const withoutReset: MethodNames<Counter> = { add: true, name: true };
    // @ts-expect-error sub is no method of Counter
    const withSub: MethodNames<Counter> = { add: true, name: true, reset: true, sub: true };
    // @ts-expect-error an engine's table without the engine's own methods (the stages' alone)
    const stagesOnly: MethodNames<EngineApi> = { ...STAGE_METHODS };
    expect([withoutReset, withSub, stagesOnly].every((table) => typeof table === 'object')).toBe(true);
    expect(Object.keys(ENGINE_METHODS).sort()).toEqual(
      [...Object.keys(STAGE_METHODS), 'load', 'probe', 'encodeText', 'decodeTile', 'encodeImage', 'alive'].sort(),
    );
  });

  it('forward: each named method runs the target’s with the same arguments, through the given function', async () => {
    const target = counter();
    const calls: string[] = [];
    const wrapped = forward(names, (call) => {
      calls.push('through');
      return call(target);
    });
    expect(await wrapped.add(2)).toBe(2);
    expect(await wrapped.add(3)).toBe(5);
    expect(await wrapped.name()).toBe('counter');
    await wrapped.reset?.();
    expect(target.total).toBe(0);
    expect(calls).toEqual(['through', 'through', 'through', 'through']);
  });

  it('Forwarding: a subclass forwards every method through its `through`, but the ones it defines itself', async () => {
    const target = counter();
    class Host extends Forwarding(names) {
      turns = 0;
      protected through<T>(call: (target: Counter) => Promise<T>): Promise<T> {
        this.turns++;
        return call(target);
      }
      override name() {
        return this.through(async (t) => `host of ${await t.name()}`);
      }
    }
    const host = new Host();
    expect(await host.add(4)).toBe(4);
    expect(await host.name()).toBe('host of counter');
    await host.reset?.();
    expect([target.total, host.turns]).toEqual([0, 3]);
  });
});
