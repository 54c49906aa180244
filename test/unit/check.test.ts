// core/net/check.ts: every value a peer sends passes one of these checks, so each bound is tested at
// both ends and each refusal says exactly what came (the message a user reads in the error).
import { describe, expect, it } from 'vitest';
import {
  ContractError,
  fields,
  floats,
  hexOf,
  int,
  list,
  none,
  num,
  oneOf,
  optional,
  text,
  type Check,
} from '../../core/net/check.ts';
import type { ApiContract } from '../../core/net/rpc.ts';
import { MACHINE_HINT_BYTES, WORKER_CONTRACT, type WorkerApi } from '../../core/worker-api.ts';

/** The ContractError a check throws for `value` at `at`. */
function refusal(check: (v: unknown, at: string) => unknown, value: unknown, at = 'reply'): ContractError {
  try {
    check(value, at);
  } catch (e) {
    expect(e).toBeInstanceOf(ContractError);
    return e as ContractError;
  }
  throw new Error(`expected ${at} to be refused`);
}

describe('a refused value is described by what came', () => {
  const anInteger = int(0, 9);
  const said = (value: unknown) =>
    refusal(anInteger, value).message.replace('reply: expected an integer in [0, 9], got ', '');

  it('names the error ContractError and the path, the expectation and the value in its message', () => {
    const e = refusal(anInteger, 10, 'reply.step');
    expect(e.name).toBe('ContractError');
    expect(e.message).toBe('reply.step: expected an integer in [0, 9], got number 10');
  });

  it('float arrays and arrays by their length, null as null, other primitives by type and value', () => {
    expect(said(new Float32Array(3))).toBe('a Float32Array of 3');
    expect(said([1, 2])).toBe('an array of 2');
    expect(said(null)).toBe('null');
    expect(said(undefined)).toBe('undefined undefined');
    expect(said(true)).toBe('boolean true');
  });

  it('strings quoted, up to 40 characters whole and longer ones cut to their first 40 and an ellipsis', () => {
    const forty = 'x'.repeat(40);
    expect(said('7')).toBe('"7"');
    expect(said(forty)).toBe(`"${forty}"`);
    expect(said(`${forty}yz`)).toBe(`"${forty}…"`);
  });

  it('objects by their first 6 field names, or as having none', () => {
    expect(said({ a: 1, b: 2 })).toBe('an object with a, b');
    expect(said({ a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7 })).toBe('an object with a, b, c, d, e, f');
    expect(said({})).toBe('an object with no fields');
  });
});

describe('the bounds of each check, both ends included', () => {
  it('num: a finite number in [min, max], unbounded by default', () => {
    expect(num()(-1e300, 'x')).toBe(-1e300);
    expect(num()(1e300, 'x')).toBe(1e300);
    expect([0, 1000].map((v) => num(0, 1000)(v, 'x'))).toEqual([0, 1000]);
    expect(refusal(num(0, 1000), -1).message).toBe('reply: expected a finite number in [0, 1000], got number -1');
    expect(refusal(num(0, 1000), 1000.5).message).toBe(
      'reply: expected a finite number in [0, 1000], got number 1000.5',
    );
  });

  it('text: a string of at most maxLength characters', () => {
    expect(text(3)('abc', 'x')).toBe('abc');
    expect(refusal(text(3), 'abcd').message).toBe('reply: expected a string of at most 3 characters, got "abcd"');
  });

  it('floats: a Float32Array of at most maxLength values', () => {
    const two = new Float32Array(2);
    expect(floats(2)(two, 'x')).toBe(two);
    expect(refusal(floats(2), new Float32Array(3)).message).toBe(
      'reply: expected a Float32Array of at most 2 values, got a Float32Array of 3',
    );
  });

  it('list: says how many items it takes', () => {
    expect(refusal(list(int(), { min: 1, max: 2 }), []).message).toBe(
      'reply: expected an array of 1 to 2 items, got an array of 0',
    );
  });
});

interface Pair {
  a: number;
  b?: number;
}

describe('fields', () => {
  const pair: Check<Pair> = fields({ a: int(), b: optional(int()) });

  it('refuses anything but a plain object, naming the fields it wants', () => {
    expect(refusal(pair, 5).message).toBe('reply: expected an object with a, b, got number 5');
    expect(refusal(pair, 'ab').message).toBe('reply: expected an object with a, b, got "ab"');
    expect(refusal(fields({}), null).message).toBe('reply: expected an object with no fields, got null');
  });

  it('leaves an absent optional field out of what it returns, rather than present and undefined', () => {
    const out = pair({ a: 1 }, 'x');
    expect(Object.keys(out)).toEqual(['a']);
    expect(Object.keys(pair({ a: 1, b: 2 }, 'x'))).toEqual(['a', 'b']);
  });

  it('is held to the type it checks: a field left out (optional or not), one too many or mistyped does not compile', () => {
    // @ts-expect-error b is optional, but left out it would vanish from every value checked
    const withoutB: Check<Pair> = fields({ a: int() });
    // @ts-expect-error a is required
    const withoutA: Check<Pair> = fields({ b: optional(int()) });
    // @ts-expect-error c is no field of Pair
    const withC: Check<Pair> = fields({ a: int(), b: optional(int()), c: int() });
    // @ts-expect-error b is a number, not a string
    const textB: Check<Pair> = fields({ a: int(), b: optional(text()) });
    // @ts-expect-error with no type to hold it to, a bare call does not compile either
    fields({ a: int() });
    // what the first would do, had it compiled: drop b
    expect(withoutB({ a: 1, b: 2 }, 'x')).toEqual({ a: 1 });
    expect([withoutA, withC, textB].map((check) => typeof check)).toEqual(['function', 'function', 'function']);
  });

  it('holds the worker contract to the WorkerApi: a reply check without an optional field does not compile', () => {
    const { describe: asDeclared } = WORKER_CONTRACT;
    const withoutBrowser: ApiContract<Pick<WorkerApi, 'describe'>> = {
      describe: {
        args: asDeclared.args,
        // @ts-expect-error the optional `browser` is not checked, so it would never reach the coordinator
        reply: fields({
          ep: oneOf('webgpu', 'wasm'),
          adapter: text(),
          softwareAdapter: oneOf(true, false),
          threads: int(1, 1024),
          memoryGiB: num(0),
          userAgent: text(),
          cores: int(1, 1024),
          machine: hexOf(MACHINE_HINT_BYTES),
        }),
      },
    };
    const info = {
      ep: 'wasm',
      adapter: 'a',
      softwareAdapter: false,
      threads: 1,
      memoryGiB: 8,
      userAgent: 'u',
      cores: 2,
      machine: '0f'.repeat(16),
    };
    expect(asDeclared.reply({ ...info, browser: 'b' }, 'reply')).toEqual({ ...info, browser: 'b' });
    expect(withoutBrowser.describe.reply({ ...info, browser: 'b' }, 'reply')).toEqual(info);
  });

  it("refuses a worker's description without its machine hint, or with one that is not 16 bytes of hex", () => {
    const info = {
      ep: 'wasm',
      adapter: 'a',
      softwareAdapter: false,
      threads: 2,
      memoryGiB: null,
      userAgent: 'u',
      cores: 2,
      machine: 'ab'.repeat(16),
    };
    const { reply } = WORKER_CONTRACT.describe;
    expect(reply(info, 'describe')).toEqual(info);
    const { machine: _, ...hintless } = info;
    expect(refusal(reply, hintless, 'describe').message).toMatch(
      /^describe\.machine: expected 16 bytes as 32 lowercase hex/,
    );
    for (const machine of ['ab'.repeat(17), 'AB'.repeat(16), 'a machine of my own', 42])
      expect(refusal(reply, { ...info, machine }, 'describe').message).toMatch(/^describe\.machine: expected 16 bytes/);
    expect(refusal(reply, { ...info, cores: 0 }, 'describe').message).toMatch(/^describe\.cores: expected an integer/);
  });
});

describe('none: no arguments', () => {
  it('takes nothing, null or an empty object, and gives an empty object', () => {
    expect([undefined, null, {}].map((v) => none(v, 'args'))).toEqual([{}, {}, {}]);
  });

  it('refuses an object with fields, an empty array, an empty string and a number', () => {
    expect(refusal(none, { a: 1 }, 'args').message).toBe('args: expected no arguments, got an object with a');
    expect(refusal(none, [], 'args').message).toBe('args: expected no arguments, got an array of 0');
    expect(refusal(none, '', 'args').message).toBe('args: expected no arguments, got ""');
    expect(refusal(none, 0, 'args').message).toBe('args: expected no arguments, got number 0');
  });
});
