// The compute of one worker: the model's stage graphs on onnxruntime-web. In a page it lives in
// a Web Worker (engine.worker.ts), so hidden-tab throttling of the page never slows it; it never
// touches the DOM or the network beyond fetching the model.
import * as ort from 'onnxruntime-web';
import type { WanConfig } from '../core/model/config.ts';
import { loadTransformer, openTransformerShapes } from '../core/model/transformer.ts';
import { heldRowNorms, readHeldWeights, widenWeight } from '../core/model/held-weights.ts';
import { allBlocks, type BlockRange } from '../core/model/blocks.ts';
import type { LoadProgress, ModelFiles } from '../core/model/files.ts';
import { defined } from '../core/defined.ts';
import { applyLoras, splitFileUrl, type LoraRef } from '../core/model/lora.ts';
import type {
  ComputeProbe,
  DecodedTile,
  DecodeTileArgs,
  EncodedImage,
  EncodeImageArgs,
  EncodedText,
  EncodeTextArgs,
  ExecutionProvider,
  LoadArgs,
  WeightType,
  LoadedModel,
  LoadStatus,
} from '../core/worker-api.ts';
import { onnxStages, type OnnxStages } from './onnx-stages.ts';
import { heldBounds, modelBounds, type ModelBounds } from './bounds.ts';
import { probeThroughput } from './throughput-probe.ts';
import { probeWebGpu } from './webgpu.ts';
import { oneAtATime, STAGE_METHODS, type DeviceStageRunner } from './stages.ts';
import { forward, type MethodNames } from './forwarding.ts';
import { textLayers } from './text-layers.ts';
import { vaeImages } from './vae-images.ts';
import { vaeTiles } from './vae-tiles.ts';
import { cachedModelFiles } from './weight-cache.ts';
import { RUN_BYTES } from '../core/safetensors.ts';

/**
 * What the worker reports of a load (less why its EP was chosen: the runtime's), the model's config,
 * and what its weights bound the tensors its rank's peers send by (an engine without: not judged).
 */
export interface EngineInfo extends Omit<LoadedModel, 'why'> {
  config: WanConfig;
  bounds?: ModelBounds;
}

/**
 * Which of a model's weights an engine holds and how: a pipeline stage's `blocks` alone (core/model/blocks.ts), `loras`
 * merged into them (core/model/lora.ts), the blocks' `weightType` (LoadArgs'); all blocks, none, the EP's where absent.
 */
export type HeldWeights = Pick<LoadArgs, 'blocks' | 'weightType'> & { loras?: readonly LoraRef[] };

export interface EngineApi extends DeviceStageRunner {
  /** loads the model's weights (kept in the browser: weight-cache.ts), saying how far it is, and builds its sessions */
  load(
    modelUrl: string,
    ep: ExecutionProvider,
    onProgress?: (status: LoadStatus) => void,
    held?: HeldWeights,
  ): Promise<EngineInfo>;
  /** matrix-multiply and softmax throughput on an EP */
  probe(ep: ExecutionProvider): Promise<ComputeProbe>;
  /**
   * the text encoder's layers [from, to) of the folder at modelUrl on a prompt's hidden states (text-layers.ts),
   * saying how far the reading of their weights is
   */
  encodeText(
    args: Omit<EncodeTextArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<EncodedText>;
  /**
   * a run of latent frames of one VAE tile of the folder at modelUrl (vae-tiles.ts), saying how far the reading of
   * the decoder's weights is where this call reads them
   */
  decodeTile(
    args: Omit<DecodeTileArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<DecodedTile>;
  /**
   * an image-to-video job's image through the VAE encoder of the folder at modelUrl (vae-images.ts), saying how far
   * the reading of the encoder's weights is where this call reads them
   */
  encodeImage(
    args: Omit<EncodeImageArgs, 'ep'> & { ep: ExecutionProvider },
    onLoad?: (status: LoadStatus) => void,
  ): Promise<EncodedImage>;
  /** resolves once the calls queued before it are done: an engine that hangs never does */
  alive(): Promise<void>;
}

/** The engine's methods by name: every wrapper of an engine (its queue, the page's turns) forwards these. */
export const ENGINE_METHODS: MethodNames<EngineApi> = {
  ...STAGE_METHODS,
  load: true,
  probe: true,
  encodeText: true,
  decodeTile: true,
  encodeImage: true,
  alive: true,
};

/**
 * How far the engine has got, as it goes: a call starts (`running`: what and where, "preAttention
 * block 3"), a call ends or a chunk of a load is read (`moved`). Posted by the engine's Web Worker
 * to its page beside comlink's messages, so that the page's pulse says how far it is.
 */
export interface EngineMove {
  running: string | null;
  moved: boolean;
}

/** the name a call goes by in a pulse: with the block, for the stages of a forward that have one */
function callLabel(method: string, args: unknown[]): string {
  return (method === 'preAttention' || method === 'postAttention') && typeof args[0] === 'number'
    ? `${method} block ${args[0]}`
    : method;
}

/** `engine` that says each move to `report` (EngineMove) */
function reportingMoves(engine: EngineApi, report: (move: EngineMove) => void): EngineApi {
  type Method = (...args: unknown[]) => Promise<unknown>;
  const calls = Object.keys(ENGINE_METHODS).map((method) => {
    const call = async (...args: unknown[]) => {
      report({ running: callLabel(method, args), moved: false });
      try {
        return await (engine[method as keyof EngineApi] as Method)(...args);
      } finally {
        report({ running: null, moved: true });
      }
    };
    return [method, call] as const;
  });
  const reporting = Object.fromEntries(calls) as unknown as EngineApi;
  reporting.load = (modelUrl, ep, onProgress, held) => {
    report({ running: 'load', moved: false });
    return engine
      .load(
        modelUrl,
        ep,
        (status) => {
          report({ running: 'load', moved: true });
          onProgress?.(status);
        },
        held,
      )
      .finally(() => report({ running: null, moved: true }));
  };
  return reporting;
}

export type Loaded = { runner: OnnxStages; bounds: ModelBounds; config: WanConfig };

/**
 * A model's blocks as a runner holds them, each weight read into that type a piece at a time (held-weights.ts): the
 * load holds what the runner keeps and a few pieces, never the blocks in float32 beside their float16 or int8 copies.
 */
export async function loadHeld(
  files: ModelFiles,
  onProgress: LoadProgress,
  blocks: BlockRange | undefined,
  ep: ExecutionProvider,
  weightType: WeightType | undefined,
  pieceBytes = RUN_BYTES,
): Promise<Loaded> {
  const { shapes, entries } = await openTransformerShapes(files, blocks);
  let bounds: ModelBounds | null = null;
  const runner = await onnxStages(shapes, ep, {
    weightType,
    takesWeights: true,
    async readHeld(plan) {
      const held = await readHeldWeights(
        files,
        entries.filter((e) => plan.has(e.name)),
        (name) => defined(plan.get(name), name),
        onProgress,
        pieceBytes,
      );
      // from the weights as held, while they are all on the CPU side (on WebGPU they leave it)
      const weight = (name: string) => defined(held.get(name), `weight ${name}`);
      bounds = heldBounds(
        shapes.config,
        shapes.blocks ?? allBlocks(shapes.config),
        (name) => widenWeight(weight(name)),
        (name) => heldRowNorms(weight(name), shapes.config.dim),
      );
      return held;
    },
  });
  return { runner, bounds: defined<ModelBounds>(bounds, "the held weights' bounds"), config: shapes.config };
}

/** A model read whole in float32, LoRA adapters merged into it, then narrowed block by block as the runner takes it. */
async function loadMerged(
  files: ModelFiles,
  onProgress: LoadProgress,
  {
    blocks,
    loras,
    weightType,
  }: { blocks: BlockRange | undefined; loras: readonly LoraRef[]; weightType: WeightType | undefined },
  ep: 'wasm' | 'webgpu',
): Promise<Loaded> {
  const model = await loadTransformer(files, onProgress, blocks);
  // the adapters' files are kept in the browser as the model's are
  await applyLoras(model, loras, (url) => {
    const { folder, name } = splitFileUrl(url);
    const folderFiles = cachedModelFiles(folder);
    return { files: folderFiles, path: name, close: () => folderFiles.close() };
  });
  // from the weights while they are all on the CPU side (on WebGPU they leave it)
  const bounds = modelBounds(model);
  // the model was read for this runner alone: the blocks' weights it copies leave the model as it takes them
  const runner = await onnxStages(model, ep, { weightType, takesWeights: true });
  return { runner, bounds, config: model.config };
}

/**
 * An engine computing WASM on `threads` threads. onnxruntime-web reads its thread count once, when
 * its WebAssembly module starts (at the first session), so an engine's threads are fixed for its
 * life: a new share of the cores is a new engine (engine-client.ts). `cpu` names what its 'wasm' EP
 * computes on (a worker process's is native: worker/node/).
 */
export function createEngine(threads = 1, report?: (move: EngineMove) => void, cpu = 'WebAssembly (CPU)'): EngineApi {
  ort.env.wasm.numThreads = threads;
  // One run at a time: a probe or a released job's last stage may arrive while another job's stage
  // is running, and a guided step's two passes call stages at once.
  const serial = oneAtATime();
  let stages: OnnxStages | null = null;
  const text = textLayers();
  const vae = vaeTiles();
  const images = vaeImages();
  let loaded: { key: string; info: EngineInfo } | null = null;
  const need = (): DeviceStageRunner => {
    if (!stages) throw new Error('the engine has no model yet: call load() first');
    return stages;
  };
  const engine: EngineApi = {
    load: async (modelUrl, ep, onProgress, { blocks, loras = [], weightType } = {}) => {
      // a worker page serves executor after executor: the same model, blocks, adapters and weight type on the same EP
      // load once
      const key = JSON.stringify([modelUrl, ep, blocks ?? 'all blocks', loras, weightType ?? "the EP's"]);
      if (loaded?.key === key) return { ...loaded.info, inMemory: true };
      const started = performance.now();
      // the device it computes on: on wasm the CPU, whether or not the browser also has a WebGPU adapter
      const adapter = ep === 'wasm' ? cpu : (await probeWebGpu())?.name;
      if (!adapter)
        throw new Error('webgpu was asked for but this browser has no WebGPU adapter; use ep "auto" or "wasm"');
      // one model at a time: the last one's sessions and weights go before the next one's come
      await stages?.dispose();
      stages = null;
      loaded = null;
      const files = cachedModelFiles(modelUrl);
      const progress = (bytes: number, totalBytes: number) => {
        const { networkBytes, note } = files.source();
        onProgress?.({ bytes, totalBytes, networkBytes, elapsedMs: performance.now() - started, note });
      };
      const { runner, bounds, config } = await (
        loras.length
          ? loadMerged(files, progress, { blocks, loras, weightType }, ep)
          : loadHeld(files, progress, blocks, ep, weightType)
      ).finally(() => files.close());
      stages = runner;
      const { maxBufferBytes, gpuWeightBytes, heldWeightBytes } = runner;
      const info: EngineInfo = {
        ep,
        adapter,
        inMemory: false,
        config,
        bounds,
        loadMs: performance.now() - started,
        weights: files.source(),
        maxBufferBytes,
        weightType: runner.weightType,
        gpuWeightBytes,
        heldWeightBytes,
      };
      loaded = { key, info };
      return info;
    },
    probe: async (ep) => {
      if (ep === 'webgpu' && !(await probeWebGpu()))
        throw new Error('cannot probe webgpu: this browser has no WebGPU adapter');
      const { flops, softmaxRate, stageMs } = await probeThroughput(ep);
      return { ep, flops, softmaxRate, stageMs };
    },
    encodeText: (args, onLoad) => text.encode(args, onLoad),
    decodeTile: (args, onLoad) => vae.decode(args, onLoad),
    encodeImage: (args, onLoad) => images.encode(args, onLoad),
    alive: () => Promise.resolve(),
    embed: (...a) => need().embed(...a),
    preAttention: (...a) => need().preAttention(...a),
    attention: (...a) => need().attention(...a),
    postAttention: (...a) => need().postAttention(...a),
    head: (...a) => need().head(...a),
    release: async (tensors) => (await need().release?.(tensors)) ?? 0,
    read: async (tensor) => {
      const values = await need().read?.(tensor);
      if (!values) throw new Error("the engine's runner keeps no device tensors to read");
      return values;
    },
  };
  // moves are said from inside the queue: a call queued behind another has not started
  const reporting = report ? reportingMoves(engine, report) : engine;
  return forward(ENGINE_METHODS, (call) => serial(() => call(reporting)));
}
