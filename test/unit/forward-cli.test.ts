import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { readSafetensors, writeSafetensors } from '../../core/safetensors.ts';
import { maxAbsDiff } from '../../core/tensor.ts';

/** `npm run forward` as a user runs it: a child process on files in a temp folder. */
const ROOT = join(import.meta.dirname, '../..');
let dir: string;

async function forward(...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)('npx', ['tsx', 'server/cli/forward.ts', ...args], {
      cwd: ROOT,
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const error = e as { code?: number; stdout?: string; stderr?: string };
    return { code: error.code ?? -1, stdout: error.stdout ?? '', stderr: error.stderr ?? '' };
  }
}

/** What `npm run forward` says as it refuses `args`: it exits 1, writes nothing to stdout and shows no stack trace. */
async function refusal(...args: string[]): Promise<string> {
  const run = await forward(...args);
  expect(run.code).toBe(1);
  expect(run.stderr).not.toMatch(/\n\s+at /);
  expect(run.stdout).toBe('');
  return run.stderr;
}

/** The line `npm run forward` prints: backend, Ulysses degree, output file, peak resident GiB. */
const SUMMARY_LINE = new RegExp(
  String.raw`^forward: sample \[1,16,2,6,10\] t=\d+ in \d+ ms on (.+), ulysses (\d+) → (.+); ` +
    String.raw`model loaded in [\d.]+ s, peak resident memory ([\d.]+) GiB\n$`,
);

const read = async (name: string) => readSafetensors(new Uint8Array(await readFile(join(dir, name))), name);

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-forward-'));
  // 2×6×10 latent → 30 tokens: not divisible by 4, so the Ulysses run pads and masks
  const made = await forward(
    '--make-input',
    join(dir, 'in.safetensors'),
    '--frames',
    '2',
    '--height',
    '6',
    '--width',
    '10',
    '--seed',
    '7',
  );
  expect(made.code, made.stderr).toBe(0);
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('npm run forward', () => {
  it('reference, onnx and onnx over 4 Ulysses ranks write the same sample within 1e-4, shaped like hidden_states', async () => {
    const runs = await Promise.all([
      forward(
        '--input',
        join(dir, 'in.safetensors'),
        '--output',
        join(dir, 'reference.safetensors'),
        '--backend',
        'reference',
      ),
      forward('--input', join(dir, 'in.safetensors'), '--output', join(dir, 'onnx.safetensors'), '--backend', 'onnx'),
      forward(
        '--input',
        join(dir, 'in.safetensors'),
        '--output',
        join(dir, 'onnx-p4.safetensors'),
        '--backend',
        'onnx',
        '--ulysses',
        '4',
      ),
    ]);
    // each run says what it ran on and over how many ranks: the P = 4 run must not be P = 1 again
    const said = runs.map((run) => {
      expect(run.code, run.stderr).toBe(0);
      const line = SUMMARY_LINE.exec(run.stdout);
      expect(line, run.stdout).not.toBeNull();
      const [, backend, degree, output, peakGiB] = defined(line, 'the summary line');
      // this process's own peak: more than nothing, far less than the machine
      expect(Number(peakGiB)).toBeGreaterThan(0.01);
      expect(Number(peakGiB)).toBeLessThan(8);
      return { backend, degree: Number(degree), output };
    });
    expect(said).toEqual([
      { backend: 'reference', degree: 1, output: join(dir, 'reference.safetensors') },
      { backend: 'onnx (wasm)', degree: 1, output: join(dir, 'onnx.safetensors') },
      { backend: 'onnx (wasm)', degree: 4, output: join(dir, 'onnx-p4.safetensors') },
    ]);

    const input = defined((await read('in.safetensors')).get('hidden_states'), 'in.safetensors hidden_states');
    const reference = defined((await read('reference.safetensors')).get('sample'), 'reference.safetensors sample');
    expect(reference.shape).toEqual([1, 16, 2, 6, 10]);
    expect(reference.shape).toEqual(input.shape);
    for (const name of ['onnx.safetensors', 'onnx-p4.safetensors']) {
      const sample = defined((await read(name)).get('sample'), `${name} sample`);
      expect(sample.shape).toEqual(input.shape);
      const diff = maxAbsDiff(sample.data, reference.data);
      console.log(`${name} max-abs vs reference ${diff.toExponential(2)}`);
      expect(diff, name).toBeLessThan(1e-4);
    }
    expect(maxAbsDiff(reference.data, input.data)).toBeGreaterThan(0.1); // a real forward, not a copy
  });

  it('--ulysses is read: more ranks than the 12 heads exits 1 saying what it allows, and writes nothing', async () => {
    const stderr = await refusal(
      '--input',
      join(dir, 'in.safetensors'),
      '--output',
      join(dir, 'p5.safetensors'),
      '--backend',
      'reference',
      '--ulysses',
      '13',
    );
    expect(stderr).toContain(
      "forward: ulyssesDegree 13 is not a whole number of ranks from 1 to the model's 12 heads (each rank takes at least one)",
    );
    await expect(readFile(join(dir, 'p5.safetensors'))).rejects.toThrow(/ENOENT/);
  });

  it('a LoRA for another model exits 1 with a message naming its key, no stack trace', async () => {
    const adapter = new Map([
      ['diffusion_model.vision.lora_down.weight', { shape: [1, 4], data: new Float32Array(4) }],
    ]);
    await writeFile(join(dir, 'other-model.safetensors'), writeSafetensors(adapter));

    const stderr = await refusal(
      '--input',
      join(dir, 'in.safetensors'),
      '--output',
      join(dir, 'never.safetensors'),
      '--backend',
      'reference',
      '--lora',
      join(dir, 'other-model.safetensors'),
    );
    expect(stderr).toContain('"diffusion_model.vision.lora_down.weight" names no module of this transformer');
  });

  it('an input without timestep exits 1 with a message naming it and the tensors the file has, no stack trace', async () => {
    const tensors = await read('in.safetensors');
    tensors.delete('timestep');
    await writeFile(join(dir, 'no-timestep.safetensors'), writeSafetensors(tensors));

    const stderr = await refusal(
      '--input',
      join(dir, 'no-timestep.safetensors'),
      '--output',
      join(dir, 'never.safetensors'),
      '--backend',
      'reference',
    );
    expect(stderr).toContain('no tensor "timestep"');
    expect(stderr).toContain('hidden_states [1,16,2,6,10]');
    expect(stderr).toContain('encoder_hidden_states [1,32,64]');
  });
});
