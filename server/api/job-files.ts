// The API's finished videos and latents: files beside the job database (<data>/videos/<id>.webm and
// <id>.latent.safetensors, and <id>.input_reference, the image a job was given), each written whole to a temporary
// name, flushed to the disk and then renamed, so a file under its own name is always complete.

import {
  chmodSync,
  closeSync,
  existsSync,
  fsyncSync,
  mkdirSync,
  openSync,
  renameSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import type { JobResult } from '../../app/automation.ts';
import { writeSafetensors } from '../../core/safetensors.ts';
import { DiskFullError } from './job-db.ts';

/** 'reference': the image a job was given (input_reference), kept for image-to-video */
export type FileVariant = 'video' | 'latent' | 'reference';

const NAMES: Record<FileVariant, (id: string) => string> = {
  video: (id) => `${id}.webm`,
  latent: (id) => `${id}.latent.safetensors`,
  reference: (id) => `${id}.input_reference`,
};

export class JobFiles {
  constructor(private readonly dir: string) {
    // the videos are the owner's: a folder an earlier server made for anyone to read is made theirs alone
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    chmodSync(dir, 0o700);
  }

  path(id: string, variant: FileVariant): string | null {
    const path = join(this.dir, NAMES[variant](id));
    return existsSync(path) ? path : null;
  }

  /** The job's video (where it made one) and its latent [z_dim, T, h, w] as safetensors ("latent"). */
  write(id: string, { video, latent, report }: JobResult): void {
    const values = new Float32Array(new Uint8Array(Buffer.from(latent, 'base64')).buffer);
    const shape = report.config.latentShape;
    this.writeWhole(join(this.dir, NAMES.latent(id)), writeSafetensors(new Map([['latent', { shape, data: values }]])));
    if (video) this.writeWhole(join(this.dir, NAMES.video(id)), Buffer.from(video, 'base64'));
  }

  /** The image the job was given, before the job is stored: an accepted job always has it. */
  writeReference(id: string, bytes: Uint8Array): void {
    this.writeWhole(join(this.dir, NAMES.reference(id)), bytes);
  }

  remove(id: string): void {
    for (const name of Object.values(NAMES)) rmSync(join(this.dir, name(id)), { force: true });
  }

  private writeWhole(path: string, bytes: Uint8Array): void {
    const partial = `${path}.partial`;
    try {
      const fd = openSync(partial, 'w', 0o600);
      try {
        for (let at = 0; at < bytes.length;) at += writeSync(fd, bytes, at);
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(partial, path);
    } catch (e) {
      rmSync(partial, { force: true });
      if ((e as NodeJS.ErrnoException).code === 'ENOSPC')
        throw new DiskFullError(`the disk holding the videos is full: ${(e as Error).message}`);
      throw e;
    }
  }
}
