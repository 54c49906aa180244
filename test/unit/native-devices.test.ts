import { describe, expect, it } from 'vitest';
import { chooseNativeDevice, probeNativeDevices, type DeviceProbe } from '../../worker/node/native-devices.ts';
import { CUDA_PROVIDERS_INSTALL } from '../../worker/node/onnxruntime-node.ts';
import { loadOnnxruntimeNode } from '../../worker/node/onnxruntime-node.ts';

// A worker process's device (issue 40): each of onnxruntime-node's devices that starts is timed, 'auto' takes the
// fastest, one asked for is taken or refused with why.

const NO_CUDA: DeviceProbe = { device: 'cuda', refused: "onnxruntime-node's CUDA providers are not installed" };

describe('choosing a native device', () => {
  it("with 'auto' takes the fastest that started and says the others' rates and why the rest did not start", () => {
    const probes: DeviceProbe[] = [{ device: 'cpu', flops: 41.2e9 }, NO_CUDA, { device: 'webgpu', flops: 2.1e12 }];
    expect(chooseNativeDevice(probes, 'auto')).toEqual({
      device: 'webgpu',
      why: "2100 GFLOP/s vs CPU 41.2; CUDA: onnxruntime-node's CUDA providers are not installed",
    });
    expect(chooseNativeDevice([{ device: 'cpu', flops: 21e9 }], 'auto')).toEqual({ device: 'cpu', why: '21 GFLOP/s' });
  });

  it('takes a device asked for even where another is faster, and says so', () => {
    const probes: DeviceProbe[] = [
      { device: 'cpu', flops: 41.2e9 },
      { device: 'webgpu', flops: 0.101e9 },
    ];
    expect(chooseNativeDevice(probes, 'webgpu')).toEqual({
      device: 'webgpu',
      why: '0.101 GFLOP/s vs CPU 41.2, as asked',
    });
  });

  it('refuses a device asked for that did not start, with its reason, and auto where none started', () => {
    expect(() => chooseNativeDevice([{ device: 'cpu', flops: 1e9 }, NO_CUDA], 'cuda')).toThrow(
      "onnxruntime-node cannot compute on CUDA here: onnxruntime-node's CUDA providers are not installed",
    );
    expect(() => chooseNativeDevice([{ device: 'webgpu', refused: 'no GPU adapter' }], 'auto')).toThrow(
      'onnxruntime-node cannot compute on any device here: no GPU adapter',
    );
  });
});

describe("timing onnxruntime-node's devices", () => {
  it('times the CPU on its matrix multiply, and says why a device that cannot start here did not', async () => {
    const ort = await loadOnnxruntimeNode();
    const [cpu, cuda] = await probeNativeDevices(ort, 1, ['cpu', 'cuda']);
    expect(cpu.device).toBe('cpu');
    // one core multiplies 512² matrices at GFLOP/s, not at the MFLOP/s of a probe that timed more than its multiply
    expect('flops' in cpu && cpu.flops).toBeGreaterThan(1e9);
    expect(cuda.device).toBe('cuda');
    // a machine with CUDA's providers installed times it instead
    if ('refused' in cuda)
      expect(cuda.refused).toContain(`CUDA providers are not installed (${CUDA_PROVIDERS_INSTALL}`);
    else expect(cuda.flops).toBeGreaterThan(1e9);
  });
});
