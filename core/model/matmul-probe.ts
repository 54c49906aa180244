// The matrix multiply a worker's compute is timed on (its FLOP/s, which decides its EP and its share): one MatMul
// [n, n]·[n, n], 2·n³ floating-point operations. Tabs time it on their EPs (rank/throughput-probe.ts), worker
// processes on their devices (worker/node/native-devices.ts).
import { OnnxGraph } from './onnx-builder.ts';

/** n deterministic values in [−1, 1): no denormals or infinities to slow a run down */
export const probeValues = (n: number, seed: number): Float32Array =>
  Float32Array.from({ length: n }, (_, i) => ((i * 2654435761 + seed) >>> 0) / 2 ** 31 - 1);

/** The probe's graph (inputs `a`, `b`, output `c`), its inputs' values and the operations one run does. */
export function matmulProbe(size: number): { graph: Uint8Array; a: Float32Array; b: Float32Array; operations: number } {
  const matmul = new OnnxGraph('throughput_probe');
  matmul.output(matmul.op('MatMul', [matmul.input('a', [size, size]), matmul.input('b', [size, size])]), 'c', [
    size,
    size,
  ]);
  return {
    graph: matmul.toBytes(),
    a: probeValues(size * size, 1),
    b: probeValues(size * size, 2),
    operations: 2 * size ** 3,
  };
}
