// Every op of the VAE's ONNX graphs (Wan2.1's and Wan2.2's, decoder and encoder, first and later
// chunks) has a kernel in onnxruntime-web's WebGPU backend, as its own list says: an op without one
// runs on the CPU, and its activations go there and back every run.

import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import onnxProto from 'onnx-proto';
import { describe, expect, it } from 'vitest';
import { buildVaeChunkGraph, buildVaeEncoderChunkGraph } from '../../core/model/wan-vae-graphs.ts';
import { parseWanVaeConfig } from '../../core/model/wan-vae.ts';
import { TINY_VAE22_CONFIG, TINY_VAE_CONFIG } from '../reference/make-wan-vae-fixture.ts';

const ortDocs = join(import.meta.dirname, '../../node_modules/onnxruntime-web/docs/webgpu-operators.md');
/** the ops in the first column of the list's table */
const webgpuOps = new Set([...readFileSync(ortDocs, 'utf8').matchAll(/^\| (\w+) \| ai\.onnx/gm)].map((m) => m[1]));

describe("the VAE graphs' ops on onnxruntime-web's WebGPU", () => {
  for (const [variant, config] of [
    ['Wan2.1', TINY_VAE_CONFIG],
    ['Wan2.2', TINY_VAE22_CONFIG],
  ] as const) {
    it(`${variant}: every op of the decoder's and the encoder's graphs has a WebGPU kernel`, () => {
      const cfg = parseWanVaeConfig(config, variant);
      const ops = new Set<string>();
      for (const first of [true, false])
        for (const graph of [buildVaeChunkGraph(cfg, first), buildVaeEncoderChunkGraph(cfg, first)])
          for (const node of onnxProto.onnx.ModelProto.decode(graph.bytes).graph?.node ?? [])
            ops.add(node.opType ?? '');
      expect(webgpuOps.size).toBeGreaterThan(50);
      // the Identity nodes that name the graph's outputs are removed by onnxruntime's optimizer (level 'all', as
      // the workers open their sessions)
      expect([...ops].filter((op) => !webgpuOps.has(op))).toEqual(['Identity']);
      expect(ops.has(cfg.isResidual ? 'DepthToSpace' : 'Resize')).toBe(true);
    });
  }
});
