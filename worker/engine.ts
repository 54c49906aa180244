import * as ort from 'onnxruntime-web';
import type { WanConfig } from '../core/model/config.ts';
import { fetchModelFiles } from '../core/model/files.ts';
import { loadTransformer } from '../core/model/transformer.ts';
import { onnxStages, type ExecutionProvider } from './onnx-stages.ts';
import { probeWebGpu } from './webgpu.ts';
import type { StageRunner } from './stages.ts';

/**
 * The compute of one worker: the model's stage graphs on onnxruntime-web. In a page it lives in
 * a Web Worker (engine.worker.ts), so hidden-tab throttling of the page never slows it; it never
 * touches the DOM or the network beyond fetching the model.
 */
export interface EngineInfo {
  ep: ExecutionProvider;
  adapter: string;
  config: WanConfig;
  loadMs: number;
}

export interface EngineApi extends StageRunner {
  load(modelUrl: string, ep: ExecutionProvider | 'auto'): Promise<EngineInfo>;
}

export function createEngine(): EngineApi {
  let stages: StageRunner | null = null;
  let loaded: { key: string; info: EngineInfo } | null = null;
  const need = (): StageRunner => {
    if (!stages) throw new Error('the engine has no model yet: call load() first');
    return stages;
  };
  return {
    async load(modelUrl, preferred) {
      // a worker page serves executor after executor: the same model on the same EP loads once
      const key = `${modelUrl} ${preferred}`;
      if (loaded?.key === key) return loaded.info;
      const started = performance.now();
      ort.env.wasm.numThreads = 1; // one thread per worker: several workers share a machine's cores
      const adapter = preferred === 'wasm' ? null : await probeWebGpu();
      if (preferred === 'webgpu' && !adapter) throw new Error('webgpu was asked for but this browser has no WebGPU adapter; use ep "auto" or "wasm"');
      const ep: ExecutionProvider = adapter ? 'webgpu' : 'wasm';
      const model = await loadTransformer(fetchModelFiles(modelUrl));
      stages = await onnxStages(model, ep);
      const info: EngineInfo = { ep, adapter: adapter ?? 'WebAssembly (no WebGPU adapter)', config: model.config, loadMs: performance.now() - started };
      loaded = { key, info };
      return info;
    },
    embed: (...a) => need().embed(...a),
    preAttention: (...a) => need().preAttention(...a),
    attention: (...a) => need().attention(...a),
    postAttention: (...a) => need().postAttention(...a),
    head: (...a) => need().head(...a),
  };
}
