import vm from 'node:vm';
import type { Page } from '@playwright/test';
import { transformSync } from 'esbuild';
import { describe, expect, it } from 'vitest';
import { PROTOCOL_VERSION, quantizedScalesHonest, tensorPayload, tensorValues } from '../../core/net/protocol.ts';
import { makeHostile, type HostileLog, type HostileRules } from '../e2e/hostile/wire.ts';

// The hostile e2e suite's wire (test/e2e/hostile/wire.ts) as Playwright hands it to a page: its
// functions' source, which a keep-names transform (tsx, esbuild) fills with calls to a `__name`
// helper the page does not have. Without the fix the rules' code threw in the page, and a hostile
// test whose tampering never happened passed.

/** The init scripts makeHostile gives a page, as the page would run them (source text). */
async function initScripts(rules: HostileRules): Promise<string[]> {
  const scripts: string[] = [];
  const page = {
    addInitScript(script: ((arg: unknown) => void) | { content: string }, arg?: unknown) {
      scripts.push(
        typeof script === 'function' ? `(${keepNames(script.toString())})(${JSON.stringify(arg)})` : script.content,
      );
      return Promise.resolve();
    },
    // the signing the page asks for in Node (the wire's 'resign'): not what these tests exercise
    exposeFunction: () => Promise.resolve(),
  };
  await makeHostile(page as unknown as Page, rules);
  return scripts;
}

/** A function's source as tsx's esbuild transform makes it: with `__name` calls and without the helper's definition. */
function keepNames(source: string): string {
  const { code } = transformSync(`globalThis.__wire = ${source};`, { keepNames: true, loader: 'js' });
  const body = code.slice(code.indexOf('globalThis.__wire = ') + 'globalThis.__wire = '.length).trim();
  expect(body).toContain('__name(');
  return body.replace(/;$/, '');
}

/** A page's globals, as far as the wire touches them; `sent` is what reached its data channels. */
function pageContext() {
  const sent: ArrayBuffer[] = [];
  class FakeEventTarget {
    addEventListener() {}
    removeEventListener() {}
  }
  class RTCDataChannel extends FakeEventTarget {
    send(data: ArrayBuffer) {
      sent.push(data);
    }
  }
  class WebSocket extends FakeEventTarget {
    send() {}
  }
  class RTCPeerConnection {
    createDataChannel() {
      return new RTCDataChannel();
    }
  }
  const context: Record<string, unknown> = {
    EventTarget: FakeEventTarget,
    RTCDataChannel,
    WebSocket,
    RTCPeerConnection,
    TextEncoder,
    TextDecoder,
    URL,
    Request,
    Response,
    DataView,
    Uint8Array,
    ArrayBuffer,
    location: { href: 'http://localhost/worker.html' },
    fetch: () => Promise.reject(new Error('no network here')),
  };
  context.window = context;
  vm.createContext(context);
  return {
    context,
    sent,
    channel: () => vm.runInContext('new RTCDataChannel()', context) as { send(d: unknown): void },
  };
}

/** A tensor frame of `step` (the wire protocol's header: magic, version, kind 2), 4 float32 values. */
function tensorFrame(step: number): ArrayBuffer {
  const frame = new Uint8Array(60 + 16);
  const view = new DataView(frame.buffer);
  frame.set([0x44, 0x57, PROTOCOL_VERSION, 2]);
  view.setUint32(16, 1, true); // chunk count
  view.setUint32(32, step, true);
  return frame.buffer;
}

/** A one-chunk tensor frame of `values` [values.length] as `dtype` goes on the wire (2: int8). */
function quantizedFrame(values: Float32Array, dtype: 0 | 2): ArrayBuffer {
  const payload = dtype === 2 ? tensorPayload(values, 'i8') : new Uint8Array(values.buffer.slice(0));
  const frame = new Uint8Array(60 + payload.byteLength);
  const view = new DataView(frame.buffer);
  frame.set([0x44, 0x57, PROTOCOL_VERSION, 2, dtype]);
  frame[6] = 1; // ndim
  view.setUint32(16, 1, true); // chunk count
  view.setUint32(32, 2, true); // step
  view.setUint32(44, values.length, true);
  frame.set(payload, 60);
  return frame.buffer;
}

describe('the hostile wire, loaded the way tsx builds it', () => {
  it('makes huge finite activations that pass every check but their bounds: float32 values and an int8 scale the quantizer could have written', async () => {
    const { context, sent, channel } = pageContext();
    for (const script of await initScripts({ mesh: { step: 2, make: 'huge' } })) vm.runInContext(script, context);
    const values = Float32Array.from({ length: 80 }, (_, i) => Math.sin(i) * 0.5);
    const ch = channel();
    ch.send(quantizedFrame(values, 0));
    ch.send(quantizedFrame(values, 2));
    expect((context.__hostileLog as HostileLog).tensorsPoisoned).toBe(2);
    const [f32, i8] = sent.map((frame) => new Uint8Array(frame).subarray(60));
    const largest = (v: Float32Array) => v.reduce((m, x) => Math.max(m, Math.abs(x)), 0);
    const asF32 = tensorValues(f32, 'f32');
    expect(asF32.every((v) => v === Math.fround(3e38))).toBe(true);
    const asI8 = tensorValues(i8, 'i8');
    expect(largest(asI8)).toBeGreaterThan(2.9e38);
    expect(asI8.every(Number.isFinite)).toBe(true);
    expect(quantizedScalesHonest(i8, 'i8')).toBe(true);
  });

  it('applies its rules: a tensor it is told to withhold never reaches the channel, and its log says so', async () => {
    const { context, sent, channel } = pageContext();
    for (const script of await initScripts({ mesh: { step: 1, make: 'withhold' } })) vm.runInContext(script, context);
    const ch = channel();
    ch.send(tensorFrame(0));
    ch.send(tensorFrame(1));
    const log = context.__hostileLog as HostileLog;
    expect(log.failures).toEqual([]);
    expect(log.tensorsWithheld).toBe(1);
    expect(sent).toHaveLength(1);
  });

  it('without the keep-names helper its own code throws where it runs: the test using it fails, it does not pass untampered', async () => {
    const { context } = pageContext();
    const [, wire] = await initScripts({ mesh: { step: 1, make: 'withhold' } }); // the helper's script left out
    expect(() => {
      vm.runInContext(wire, context);
    }).toThrow(/__name is not defined/);
  });
});
