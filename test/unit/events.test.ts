// core/events.ts: the one emitter behind links, the relay client, the swarm and the job queue.
import { describe, expect, it } from 'vitest';
import { Emitter } from '../../core/events.ts';

describe('Emitter', () => {
  it('listeners hear each event in the order they were added, until the function `on` returned is called', () => {
    const heard: string[] = [];
    const events = new Emitter<number>();
    const offA = events.on((n) => heard.push(`a${n}`));
    events.on((n) => heard.push(`b${n}`));
    events.emit(1);
    offA();
    events.emit(2);
    expect(heard).toEqual(['a1', 'b1', 'b2']);
    expect(events.size).toBe(1);
  });

  it('a listener that throws is reported, and the listeners after it still hear the event', () => {
    const reported: unknown[] = [];
    const heard: number[] = [];
    const events = new Emitter<number>((error) => reported.push(error));
    const boom = new Error('boom');
    events.on(() => {
      throw boom;
    });
    events.on((n) => heard.push(n));
    expect(() => events.emit(7)).not.toThrow();
    expect([reported, heard]).toEqual([[boom], [7]]);
  });

  it('an event goes to the listeners there were when it was emitted: none added or removed meanwhile', () => {
    const heard: string[] = [];
    const events = new Emitter<number>();
    const late = (n: number) => heard.push(`late${n}`);
    const second = (n: number) => heard.push(`second${n}`);
    events.on((n) => {
      heard.push(`first${n}`);
      events.off(second);
      events.on(late);
    });
    events.on(second);
    events.emit(1);
    expect(heard).toEqual(['first1', 'second1']);
    events.clear();
    events.emit(2);
    expect(heard).toEqual(['first1', 'second1']);
  });
});
