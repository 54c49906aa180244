import { EXACT_SETTINGS } from './in-process-executor.ts';
import { describe, expect, it } from 'vitest';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { WorkerRuntime } from '../../rank/runtime.ts';
import { modelSource } from '../../worker/model-origin.ts';
import { describeInProcess } from './fixtures.ts';

// A coordinator (or whoever took its id) names the model a worker loads: the worker reads only
// its own server's folders and the one that server was started on (issue 17, finding 1).
/** what `source` answers for `url`: where it reads it, or its refusal */
const read = (source: (url: string) => string, url: string): string => {
  try {
    return source(url);
  } catch (e) {
    return `refused: ${(e as Error).message}`;
  }
};

describe("a worker page's model folders", () => {
  const source = modelSource('http://192.168.1.5:5173', ['https://models.example.org/wan2.1/']);
  const refuse = (url: string) =>
    read(source, url)
      .replace(/^(?!refused: ).*/, 'read')
      .replace(/^refused: /, '');
  it("reads its own server's folders and the server's --model", () => {
    expect(read(source, 'http://192.168.1.5:5173/models/tiny-wan')).toBe('http://192.168.1.5:5173/models/tiny-wan');
    expect(read(source, 'http://192.168.1.5:5173/models/local/')).toBe('http://192.168.1.5:5173/models/local/');
    expect(read(source, 'https://models.example.org/wan2.1')).toBe('https://models.example.org/wan2.1');
  });
  it('refuses any other origin, or a folder of the --model origin other than it, naming what it reads', () => {
    expect(refuse('http://evil.example/huge.bin')).toBe(
      'this worker reads model folders from http://192.168.1.5:5173 and https://models.example.org/wan2.1 only, not http://evil.example',
    );
    expect(refuse('https://models.example.org/other')).toMatch(/not https:\/\/models\.example\.org$/);
    expect(refuse('http://192.168.1.5:5174/models/tiny-wan')).toMatch(/not http:\/\/192\.168\.1\.5:5174$/);
    expect(refuse('file:///etc/passwd')).toMatch(/not null$|not file:/);
    expect(refuse('not a url')).toBe('"not a url" is not a URL');
  });
  it("reads a folder its server serves, named by any of that server's names, from its own origin", () => {
    // the dashboard at the server's localhost, this worker on another machine at the server's LAN name
    const lan = modelSource('https://vm.local:5173', [], ['http://localhost:5173', 'https://10.0.0.5:5173']);
    expect(read(lan, 'http://localhost:5173/models/tiny-wan?v=2')).toBe('https://vm.local:5173/models/tiny-wan?v=2');
    expect(read(lan, 'https://10.0.0.5:5173/loras/0/a.safetensors')).toBe(
      'https://vm.local:5173/loras/0/a.safetensors',
    );
    // another port of localhost is another server: not this one's to rebase
    expect(read(lan, 'http://localhost:5174/models/tiny-wan')).toBe(
      'refused: this worker reads model folders from https://vm.local:5173 only, not http://localhost:5174',
    );
  });
  it('reads an adapter file the server was started on (--lora URL), that file and no other of its folder', () => {
    const lora = 'https://hf.example/lightx2v/distill.safetensors';
    const withLora = modelSource('http://localhost:5173', ['/models/local', lora]);
    expect(read(withLora, lora)).toBe(lora);
    expect(read(withLora, 'http://localhost:5173/loras/0/x.safetensors')).toBe(
      'http://localhost:5173/loras/0/x.safetensors',
    );
    expect(read(withLora, 'https://hf.example/lightx2v/other.safetensors')).toBe(
      'refused: ' +
        'this worker reads model folders from http://localhost:5173 and https://hf.example/lightx2v/distill.safetensors only, not https://hf.example',
    );
  });
  it('without a --model, reads its own server only', () => {
    expect(read(modelSource('http://localhost:5173', []), 'https://models.example.org/wan2.1')).toBe(
      'refused: this worker reads model folders from http://localhost:5173 only, not https://models.example.org',
    );
  });
});

describe('a worker runtime asked for a folder its page refuses', () => {
  it('refuses loadModel, rehearse, encodeText and decodeTile before its engine reads anything', async () => {
    const loads: string[] = [];
    const engine = {
      load: async (url: string) => (loads.push(url), Promise.reject(new Error('not reached'))),
      encodeText: async () => (loads.push('encodeText'), Promise.reject(new Error('not reached'))),
      decodeTile: async () => (loads.push('decodeTile'), Promise.reject(new Error('not reached'))),
    } as unknown as EngineApi;
    const runtime = new WorkerRuntime(engine, {
      connectMesh: () => Promise.resolve(memoryExchanges(1)[0]),
      describe: describeInProcess('node'),
      modelSource: modelSource('http://localhost:5173', []),
    });
    await runtime.initWorker({ ...EXACT_SETTINGS, rank: 0, world: 1, peers: ['w0'], session: 's' });
    const evil = 'http://evil.example/model';
    const refusal = 'this worker reads model folders from http://localhost:5173 only, not http://evil.example';
    await expect(runtime.loadModel({ modelUrl: evil, ep: 'wasm' })).rejects.toThrow(refusal);
    await expect(
      runtime.rehearse({
        modelUrl: evil,
        ep: 'wasm',
        latentShape: [16, 1, 2, 2],
        textTokens: 4,
        degrees: [1],
        forwards: 1,
      }),
    ).rejects.toThrow(refusal);
    await expect(
      runtime.encodeText({ modelUrl: evil, ep: 'wasm', from: 0, to: 1, tokens: 1, hidden: new Float32Array(4) }),
    ).rejects.toThrow(refusal);
    await expect(
      runtime.decodeTile({
        modelUrl: evil,
        ep: 'wasm',
        tile: 't',
        from: 0,
        last: true,
        shape: [16, 1, 1, 1],
        latent: new Float32Array(16),
      }),
    ).rejects.toThrow(refusal);
    expect(loads).toEqual([]);
    expect(runtime.state).toBe('initialized');
  });
});
