// `npm run decode` as a user runs it, up to where it would start Chromium: it takes a Wan2.1 or a
// Wan2.2 VAE folder, and refuses a latent whose channels are not the folder's z_dim before any
// browser starts (the decoding itself, on worker tabs, is coordinator/vae-decoding.ts's: the unit
// tests vae-decoding and wan22-vae-decoding hold it).

import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writeSafetensors } from '../../core/safetensors.ts';
import { sizeOf } from '../../core/tensor.ts';
import { writeWanVaeFolder } from '../../server/model-folder.ts';
import { TINY_VAE22_CONFIG, TINY_VAE_CONFIG } from '../reference/make-wan-vae-fixture.ts';

const ROOT = join(import.meta.dirname, '../..');
let dir: string;

/** What `npm run decode` says as it refuses `args`: it exits 1, writes nothing to stdout and shows no stack trace. */
async function refusal(...args: string[]): Promise<string> {
  try {
    await promisify(execFile)('npx', ['tsx', 'server/cli/decode.ts', ...args], { cwd: ROOT });
  } catch (e) {
    const error = e as { code?: number; stdout?: string; stderr?: string };
    expect(error.code).toBe(1);
    expect(error.stdout).toBe('');
    expect(error.stderr).not.toMatch(/\n\s+at /);
    return error.stderr ?? '';
  }
  throw new Error(`npm run decode ${args.join(' ')} did not refuse`);
}

async function writeLatent(name: string, shape: number[]): Promise<string> {
  const path = join(dir, name);
  const data = new Float32Array(sizeOf(shape)).fill(0.5);
  await writeFile(path, writeSafetensors(new Map([['latent', { shape, data }]])));
  return path;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'ditswarm-decode-cli-'));
  await writeWanVaeFolder(join(dir, 'wan21'), TINY_VAE_CONFIG);
  await writeWanVaeFolder(join(dir, 'wan22'), TINY_VAE22_CONFIG);
});

afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('npm run decode', () => {
  it("refuses a latent of other channels than the folder's z_dim, Wan2.2's 48 or Wan2.1's 16, before a browser starts", async () => {
    const [wan21Latent, wan22Latent] = await Promise.all([
      writeLatent('wan21.safetensors', [1, 16, 2, 3, 4]),
      writeLatent('wan22.safetensors', [48, 2, 3, 4]),
    ]);
    const output = join(dir, 'video.safetensors');
    const [toWan22, toWan21] = await Promise.all([
      refusal('--model', join(dir, 'wan22'), '--latent', wan21Latent, '--output', output),
      refusal('--model', join(dir, 'wan21'), '--latent', wan22Latent, '--output', output),
    ]);
    expect(toWan22).toBe(
      `decode: --latent ${wan21Latent}: the latent [16,2,3,4] has 16 channels, and ` +
        `${join(dir, 'wan22')}'s VAE (z_dim 48) decodes [48, T, h, w]: give a latent made for this VAE\n`,
    );
    expect(toWan21).toBe(
      `decode: --latent ${wan22Latent}: the latent [48,2,3,4] has 48 channels, and ` +
        `${join(dir, 'wan21')}'s VAE (z_dim 16) decodes [16, T, h, w]: give a latent made for this VAE\n`,
    );
  });

  it("says in its usage that a latent's channels are the VAE's z_dim, Wan2.2's 48, and its video 16 pixels a latent pixel", async () => {
    const usage = await refusal('--latent', 'x.safetensors', '--output', 'y.safetensors');
    expect(usage).toContain('--model is required: a folder with vae/ (AutoencoderKLWan)');
    expect(usage).toContain("latent [1, z, T, h, w] (or [z, T, h, w]; z is the VAE's z_dim: 16, Wan2.2's 48)");
    expect(usage).toContain('"video" [1, 3, 1 + 4(T−1), s·h, s·w] in [−1, 1] (s = 8, Wan2.2\'s 16)');
  });
});
