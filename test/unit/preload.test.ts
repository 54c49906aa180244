import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { preloadOnJoin } from '../../coordinator/preload.ts';
import { stagedModel } from '../../coordinator/stage-plan.ts';
import type { SwarmEvent, SwarmWorker } from '../../coordinator/swarm.ts';
import { Emitter } from '../../core/events.ts';
import { parseWanConfig } from '../../core/model/config.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';

// the published 1.3B's shape: 5.7 GB of float32 weights as ranks hold them
const config = parseWanConfig(WAN21_T2V_1_3B.transformer, 'the 1.3B config');
const model = stagedModel(config);
const modelBytes = model.numLayers * model.blockBytes + model.firstBytes + model.lastBytes;

function worker(id: string, memoryGiB: number | null, measured = true) {
  const preloaded: string[] = [];
  const w = {
    id,
    info: { memoryGiB },
    measurement: measured ? {} : null,
    api: {
      preload: ({ modelUrl }: { modelUrl: string }) => {
        preloaded.push(modelUrl);
        return Promise.resolve({ ep: 'wasm', loadMs: 1 });
      },
    },
  } as unknown as SwarmWorker;
  return { w, preloaded };
}

const settle = () => new Promise((r) => setTimeout(r, 10));

describe('weights before the first job (issue 36)', () => {
  it('a worker preloads the dashboard’s model once it is measured, once per model, never during a job or past its budget', async () => {
    const events = new Emitter<SwarmEvent>();
    let modelUrl = 'http://localhost/models/a';
    let busy = false;
    const logged: string[] = [];
    const stop = preloadOnJoin(events, {
      modelUrl: () => modelUrl,
      config: () => Promise.resolve(config),
      busy: () => busy,
      log: (line) => logged.push(line),
    });
    const big = worker('big', 8); // 8 GiB, the most a browser reports: the 1.3B's 5.7 GB fit
    const small = worker('small', 4); // less than the weights
    const unmeasured = worker('unmeasured', 24, false);
    for (const { w } of [big, small, unmeasured]) events.emit({ type: 'join', worker: w });
    await settle();
    expect(big.preloaded).toEqual(['http://localhost/models/a']);
    expect(small.preloaded).toEqual([]);
    expect(logged).toEqual([
      `not preloading http://localhost/models/a on small: its weights pass what it may give the model`,
    ]);
    expect(unmeasured.preloaded).toEqual([]); // its EPs are measured first, then it loads on the faster
    // pulses come and go: the model is not asked again
    events.emit({ type: 'update', worker: big.w });
    await settle();
    expect(big.preloaded).toHaveLength(1);
    // a job runs: nothing competes with it
    busy = true;
    (unmeasured.w as { measurement: unknown }).measurement = {};
    events.emit({ type: 'update', worker: unmeasured.w });
    await settle();
    expect(unmeasured.preloaded).toEqual([]);
    busy = false;
    events.emit({ type: 'update', worker: unmeasured.w });
    // the form's model changes: the next pulse loads it
    modelUrl = 'http://localhost/models/b';
    events.emit({ type: 'update', worker: big.w });
    await settle();
    expect(unmeasured.preloaded).toEqual(['http://localhost/models/a']);
    expect(big.preloaded).toEqual(['http://localhost/models/a', 'http://localhost/models/b']);
    stop();
  });

  it('the bundled demo model is preloaded too: its engine warms up before the first job, not in it (issue 66)', async () => {
    const demo = parseWanConfig(
      JSON.parse(
        readFileSync(join(import.meta.dirname, '../../public/models/tiny-wan-demo/transformer/config.json'), 'utf8'),
      ),
      'the demo config',
    );
    const events = new Emitter<SwarmEvent>();
    const { w, preloaded } = worker('w', null);
    preloadOnJoin(events, {
      modelUrl: () => 'http://localhost/models/tiny-wan-demo',
      config: () => Promise.resolve(demo),
      busy: () => false,
    });
    events.emit({ type: 'join', worker: w });
    await settle();
    expect(preloaded).toEqual(['http://localhost/models/tiny-wan-demo']);
  });

  it('a model smaller than a driver’s threshold is left to the placement', async () => {
    const events = new Emitter<SwarmEvent>();
    const { w, preloaded } = worker('w', 24);
    preloadOnJoin(events, {
      modelUrl: () => 'http://localhost/models/a',
      config: () => Promise.resolve(config),
      busy: () => false,
      fromBytes: () => modelBytes + 1,
    });
    events.emit({ type: 'join', worker: w });
    await settle();
    expect(preloaded).toEqual([]);
  });
});
