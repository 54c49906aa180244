import { createHash } from 'node:crypto';
import { join } from 'node:path';
import * as ort from 'onnxruntime-web';
import type { WanConfig } from '../../core/model/config.ts';
import type { ModelFiles } from '../../core/model/files.ts';
import type { Channel } from '../../core/net/channel.ts';
import { Link } from '../../core/net/link.ts';
import type { DType } from '../../core/net/protocol.ts';
import { inProcess, type Remote } from '../../core/net/rpc.ts';
import {
  WORKER_CONTRACT,
  type HandOffMesh,
  type InitArgs,
  type WorkerApi,
  type WorkerInfo,
} from '../../core/worker-api.ts';
import type { EngineApi } from '../../rank/engine.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import type { ModelBounds } from '../../rank/bounds.ts';
import { WorkerRuntime, type StagePartners } from '../../rank/runtime.ts';
import type { KeepsEvidence } from '../../rank/exchange/ledger.ts';
import { handOffDType } from '../../rank/hand-off.ts';
import type { PointToPoint } from '../../rank/ulysses.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { Swarm } from '../../coordinator/swarm.ts';
import type { SwarmKeys } from '../../core/net/join-token.ts';
import type { SignalingOptions } from '../../core/net/peer-link.ts';
import { serialStages, type DeviceStageRunner } from '../../rank/stages.ts';

export const TINY_MODEL_DIR = join(import.meta.dirname, '../../public/models/tiny-wan');

export const tinyModelFiles: ModelFiles = folderFiles(TINY_MODEL_DIR);

ort.env.wasm.numThreads = 1;

/**
 * An engine on these stages that loads and probes at once, as a worker's would once its model is in;
 * its ranks judge their peers' tensors against `bounds` where given.
 */
export function stubEngine(stages: DeviceStageRunner, config: WanConfig, bounds?: ModelBounds): EngineApi {
  return {
    ...serialStages(stages),
    load: () =>
      Promise.resolve({
        ep: 'wasm',
        adapter: 'test',
        inMemory: false,
        config,
        ...(bounds && { bounds }),
        loadMs: 0,
        weights: { networkBytes: 0, cacheBytes: 0, note: '' },
        maxBufferBytes: 1 << 28,
        weightType: 'float32',
        gpuWeightBytes: 0,
        heldWeightBytes: 0,
      }),
    probe: (ep) => Promise.resolve({ ep, flops: 1e9, softmaxRate: 2e8, stageMs: 0.5 }),
    encodeText: () => Promise.reject(new Error('this stub engine has no text encoder')),
    decodeTile: () => Promise.reject(new Error('this stub engine has no VAE')),
    encodeImage: () => Promise.reject(new Error('this stub engine has no VAE')),
    alive: async () => {},
  };
}

/** P worker runtimes over one in-memory mesh, each also as the coordinator calls it: through the contract's checks. */
export function inProcessRanks(
  world: number,
  engine: EngineApi,
  dtype: DType = 'f32',
): { runtimes: WorkerRuntime[]; ranks: Remote<WorkerApi>[] } {
  const exchanges = memoryExchanges(world, dtype);
  const runtimes = exchanges.map(
    (exchange, rank) =>
      new WorkerRuntime(engine, {
        connectMesh: () => Promise.resolve(exchange),
        describe: describeInProcess(`in-process rank ${rank}`),
      }),
  );
  return { runtimes, ranks: runtimes.map((r, rank) => inProcess<WorkerApi>(r, WORKER_CONTRACT, `rank ${rank}`)) };
}

/** One direction of a data channel that delivers each frame on a later task, in order. */
export function channelPair(): [Link, Link] {
  const channel = (deliver: (frame: ArrayBuffer) => void): Channel => ({
    bufferedAmount: 0,
    bufferedAmountLowThreshold: 0,
    send: (frame) => void setImmediate(() => deliver(frame)),
    addEventListener() {},
    removeEventListener() {},
  });
  const a: Link = new Link(channel((f) => b.receive(f)));
  const b: Link = new Link(channel((f) => a.receive(f)));
  return [a, b];
}

/** Well-formed arguments of the job methods, as far as the contract can tell (the model's widths aside). */
export const validJobArgs = {
  loadModel: { modelUrl: '/models/tiny-wan', ep: 'auto' as const },
  prepareJob: { job: 1, texts: [new Float32Array(4)], latentShape: [16, 1, 8, 8] },
  executeModel: { job: 1, step: 0, pass: 0, timestep: 500, latentShape: [16, 1, 8, 8], patches: new Float32Array(64) },
};

/** A channel whose sends are only recorded (the peer never answers). */
export class SinkChannel implements Channel {
  bufferedAmount = 0;
  bufferedAmountLowThreshold = 0;
  sent: ArrayBuffer[] = [];
  send(data: ArrayBuffer) {
    this.sent.push(data);
  }
  // as properties, a test may swap in a listener that it then calls
  addEventListener: Channel['addEventListener'] = () => {};
  removeEventListener: Channel['removeEventListener'] = () => {};
}

/** A machine hint (WorkerInfo.machine) of a machine named `name`: one name, one machine. */
export const machineNamed = (name: string): string => createHash('sha256').update(name).digest('hex').slice(0, 32);

/** A worker's description as an in-process rank gives it: WebAssembly on one thread, a machine of its own. */
export function describeInProcess(userAgent = 'in-process'): () => Promise<WorkerInfo> {
  return () =>
    Promise.resolve({
      ep: 'wasm',
      adapter: 'test',
      softwareAdapter: false,
      threads: 1,
      memoryGiB: null,
      userAgent,
      cores: 1,
      machine: machineNamed(userAgent),
    });
}

/** What a server at localhost with no relay, no ICE servers and no https publishes to its pages. */
export const LOCAL_SIGNALING: SignalingOptions = {
  host: 'localhost',
  port: 8080,
  path: '/peerjs',
  key: 'k',
  secure: false,
  iceServers: [],
  relay: { mode: 'off', path: '/relay' },
  lanOrigins: [],
  origins: [],
  ca: null,
};

/** A Swarm of a dashboard at `origin` on a stub peer (its constructor is private; Swarm.open registers a real one). */
export function stubSwarm(origin: string, keys: SwarmKeys, signaling: SignalingOptions = LOCAL_SIGNALING): Swarm {
  const peer = { id: 'ditswarm-c-test', on() {}, destroy() {} };
  type SwarmConstructor = new (peer: unknown, origin: string, keys: SwarmKeys, signaling: SignalingOptions) => Swarm;
  return new (Swarm as unknown as SwarmConstructor)(peer, origin, keys, signaling);
}

/**
 * Hand-off links in memory, as worker pages link over data channels (worker/mesh.ts connectStages): each pair of
 * ranks one memory exchange of two, found by its session, in the dtype a hand-off travels in.
 */
export function memoryStageLinks(): (init: InitArgs) => Promise<StagePartners> {
  const pairs = new Map<string, (PointToPoint & KeepsEvidence)[]>();
  const end = (pair: HandOffMesh, dtype: DType) => {
    const ends = pairs.get(pair.session) ?? memoryExchanges(2, handOffDType(dtype));
    pairs.set(pair.session, ends);
    return ends[pair.rank];
  };
  return ({ stageLinks, dtype }) =>
    Promise.resolve({
      ...(stageLinks?.before && { before: end(stageLinks.before, dtype) }),
      ...(stageLinks?.after && { after: end(stageLinks.after, dtype) }),
    });
}
