import { copyFileSync, mkdtempSync, readFileSync, rmSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { tmpdir } from 'node:os';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { expectedWeightShapes, parseWanConfig } from '../../core/model/config.ts';
import { fetchModelFiles, MAX_WHOLE_FILE_BYTES, type ModelFiles } from '../../core/model/files.ts';
import type { WanModel } from '../../core/model/reference.ts';
import {
  loadTransformer,
  openTransformer,
  TRANSFORMER_CONFIG,
  TRANSFORMER_WEIGHTS_NAME,
} from '../../core/model/transformer.ts';
import { planShards, readTensor, safetensorsHeader } from '../../core/safetensors.ts';
import { sizeOf } from '../../core/tensor.ts';
import { folderFiles, writeCheckpoint } from '../../server/model-folder.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { TINY_MODEL_DIR, tinyModelFiles } from './fixtures.ts';

// Checkpoints as diffusers publishes them, single-file or sharded with an index, read tensor by
// tensor by byte ranges (files in Node, Range requests in pages), checked before a weight is read.

/** a sharded checkpoint's index, as save_pretrained writes it */
interface ShardIndex {
  metadata: { total_size: number };
  weight_map: Record<string, string>;
}

describe('the published Wan2.1-T2V-1.3B layout', () => {
  it('comes out of the state-dict order and the 5 GB split at exactly the published shard sizes', () => {
    const config = parseWanConfig(WAN21_T2V_1_3B.transformer, 'published');
    const tensors = [...expectedWeightShapes(config)].map(([name, shape]) => ({ name, shape }));
    expect(tensors.length).toBe(825);
    expect(tensors.reduce((n, t) => n + sizeOf(t.shape), 0)).toBe(1_418_996_800);
    const shards = planShards(tensors, 5e9);
    const fileBytes = shards.map(
      (shard) =>
        safetensorsHeader(shard, { format: 'pt' }).head.length + shard.reduce((n, t) => n + 4 * sizeOf(t.shape), 0),
    );
    expect(fileBytes).toEqual([4_998_781_576, 677_289_072]);
  });
});

describe('a sharded checkpoint', () => {
  let dir: string;
  let tiny: WanModel;
  /** the tiny model's transformer as shards of at most 300 kB, beside its config */
  const writeSharded = async (to: string) => {
    await writeCheckpoint(
      join(to, 'transformer'),
      TRANSFORMER_WEIGHTS_NAME,
      [...tiny.weights].map(([name, t]) => ({ name, shape: t.shape })),
      ({ name }) => defined(tiny.weights.get(name), name).data,
      { maxShardBytes: 300_000 },
    );
    copyFileSync(join(TINY_MODEL_DIR, TRANSFORMER_CONFIG), join(to, TRANSFORMER_CONFIG));
  };
  /** the tensors whose shape or bytes differ from the tiny model's */
  const differing = (loaded: WanModel) =>
    [...tiny.weights]
      .filter(([name, t]) => {
        const other = loaded.weights.get(name);
        return (
          !other ||
          other.shape.join() !== t.shape.join() ||
          !Buffer.from(other.data.buffer, other.data.byteOffset, other.data.byteLength).equals(
            Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength),
          )
        );
      })
      .map(([name]) => name);
  const index = () =>
    JSON.parse(
      readFileSync(join(dir, 'transformer/diffusion_pytorch_model.safetensors.index.json'), 'utf8'),
    ) as ShardIndex;
  /** a fresh sharded copy that `spoil` may break */
  const spoiled = async (spoil: (dir: string) => void): Promise<ModelFiles> => {
    const to = mkdtempSync(join(tmpdir(), 'ditswarm-spoiled-'));
    await writeSharded(to);
    spoil(to);
    return folderFiles(to);
  };

  beforeAll(async () => {
    tiny = await loadTransformer(tinyModelFiles);
    dir = mkdtempSync(join(tmpdir(), 'ditswarm-sharded-'));
    await writeSharded(dir);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('is written as save_pretrained writes one (shards named -0000i-of-0000n, an index with total_size) and loads to the same weights', async () => {
    const { metadata, weight_map } = index();
    const shards = [...new Set(Object.values(weight_map))].sort();
    expect(shards.length).toBeGreaterThan(3);
    expect(shards[0]).toBe(`diffusion_pytorch_model-00001-of-${String(shards.length).padStart(5, '0')}.safetensors`);
    expect(metadata.total_size).toBe([...tiny.weights.values()].reduce((n, t) => n + 4 * t.data.length, 0));
    const loaded = await loadTransformer(folderFiles(dir));
    expect([...loaded.weights.keys()].sort()).toEqual([...tiny.weights.keys()].sort());
    expect(differing(loaded)).toEqual([]);
  });

  it('is read by byte ranges: opening it reads headers only, and no read is larger than the largest tensor', async () => {
    const files = folderFiles(dir);
    const reads: number[] = [];
    let progress: [number, number][] = [];
    await loadTransformer(
      {
        read: (path) => files.read(path),
        readRange: (path, begin, end) => (reads.push(end - begin), files.readRange(path, begin, end)),
      },
      (loaded, total) => progress.push([loaded, total]),
    );
    const largest = Math.max(...[...tiny.weights.values()].map((t) => 4 * t.data.length));
    expect(Math.max(...reads)).toBe(largest);
    expect(progress.at(-1)).toEqual([index().metadata.total_size, index().metadata.total_size]);
    expect(progress.every(([loaded], i) => i === 0 || loaded > progress[i - 1][0])).toBe(true);
    progress = [];
  });

  it('over HTTP: Range requests where the server answers them, each file fetched once where it does not', async () => {
    const requests: { path: string; range: string | undefined }[] = [];
    const serve = (ranges: boolean): Promise<Server> =>
      new Promise((resolve) => {
        const server = createServer((req, res) => {
          const path = decodeURIComponent((req.url ?? '/').slice(1));
          requests.push({ path, range: req.headers.range });
          let body: Buffer;
          try {
            body = readFileSync(join(dir, path));
          } catch {
            return void res.writeHead(404).end();
          }
          const range = ranges && /^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '');
          if (!range) return void res.writeHead(200, { 'Content-Length': body.length }).end(body);
          const [begin, last] = [Number(range[1]), Math.min(Number(range[2]), body.length - 1)];
          if (begin >= body.length) return void res.writeHead(416).end();
          res
            .writeHead(206, { 'Content-Range': `bytes ${begin}-${last}/${body.length}` })
            .end(body.subarray(begin, last + 1));
        });
        server.listen(0, '127.0.0.1', () => resolve(server));
      });
    for (const ranges of [true, false]) {
      requests.length = 0;
      const server = await serve(ranges);
      try {
        const { port } = server.address() as { port: number };
        const loaded = await loadTransformer(fetchModelFiles(`http://127.0.0.1:${port}/`));
        expect(differing(loaded)).toEqual([]);
      } finally {
        server.close();
      }
      const shardRequests = requests.filter((r) => r.path.endsWith('.safetensors'));
      const shards = new Set(shardRequests.map((r) => r.path)).size;
      if (ranges) expect(shardRequests.every((r) => r.range)).toBe(true);
      // without Range: the first request of each shard brought it whole, and it was kept
      else expect(shardRequests.length).toBe(shards);
    }
  });

  it("broken, fails when opened (the coordinator's check before a job) or while loading, naming the file and the tensor", async () => {
    const shard = (n: number, of: number) =>
      `diffusion_pytorch_model-${String(n).padStart(5, '0')}-of-${String(of).padStart(5, '0')}.safetensors`;
    const count = new Set(Object.values(index().weight_map)).size;
    const rewriteIndex = (to: string, change: (i: ShardIndex) => void) => {
      const path = join(to, 'transformer/diffusion_pytorch_model.safetensors.index.json');
      const json = JSON.parse(readFileSync(path, 'utf8')) as ShardIndex;
      change(json);
      writeFileSync(path, JSON.stringify(json));
    };
    const failure = async (files: ModelFiles): Promise<Error> => {
      try {
        await loadTransformer(files);
      } catch (e) {
        return e as Error;
      }
      throw new Error('the broken checkpoint loaded');
    };

    const missingShard = await failure(await spoiled((to) => unlinkSync(join(to, 'transformer', shard(2, count)))));
    expect(missingShard.message).toMatch(
      new RegExp(
        `diffusion_pytorch_model.safetensors.index.json names shard ${shard(2, count)} \\(for \\d+ tensors, ".+" first\\), but transformer/${shard(2, count)} is missing`,
      ),
    );

    const missingTensor = await failure(
      await spoiled((to) => rewriteIndex(to, (i) => (i.weight_map['blocks.0.attn1.to_q.extra'] = shard(1, count)))),
    );
    expect(missingTensor.message).toBe(
      `transformer/diffusion_pytorch_model.safetensors.index.json puts tensor "blocks.0.attn1.to_q.extra" in ${shard(1, count)}, but transformer/${shard(1, count)} has no such tensor`,
    );

    const escaping = await failure(
      await spoiled((to) => rewriteIndex(to, (i) => (i.weight_map['proj_out.bias'] = '../../secrets.safetensors'))),
    );
    expect(escaping.message).toBe(
      'transformer/diffusion_pytorch_model.safetensors.index.json: tensor "proj_out.bias" is mapped to "../../secrets.safetensors", not a .safetensors file of transformer/',
    );

    const truncated = await failure(
      await spoiled((to) => truncateSync(join(to, 'transformer', shard(count, count)), 1000)),
    );
    expect(truncated.message).toMatch(
      new RegExp(
        `^transformer/${shard(count, count)}: its tensors need \\d+ bytes but the file ends before: truncated\\? fetch it again$`,
      ),
    );

    // a shard cut short after it was opened (a download still being written, say): its tensor's read says so
    const cutLater = mkdtempSync(join(tmpdir(), 'ditswarm-spoiled-'));
    await writeSharded(cutLater);
    const { checkpoint } = await openTransformer(folderFiles(cutLater));
    const last = [...checkpoint.tensors.values()].find((t) => t.file.endsWith(shard(count, count)));
    truncateSync(join(cutLater, 'transformer', shard(count, count)), 1000);
    await expect(readTensor(folderFiles(cutLater), defined(last, 'a tensor of the last shard'))).rejects.toThrow(
      new RegExp(
        `^transformer/${shard(count, count)}: tensor ".+" needs bytes \\[\\d+, \\d+\\) but the file holds \\d+ of them: truncated\\? fetch it again$`,
      ),
    );

    const misshapen = await failure(
      await spoiled((to) => {
        const config = JSON.parse(readFileSync(join(to, TRANSFORMER_CONFIG), 'utf8')) as { ffn_dim: number };
        writeFileSync(join(to, TRANSFORMER_CONFIG), JSON.stringify({ ...config, ffn_dim: config.ffn_dim + 1 }));
      }),
    );
    expect(misshapen.message).toMatch(
      new RegExp(
        '^transformer/diffusion_pytorch_model.safetensors.index.json does not match its config: wrong shapes: blocks.0.ffn.net.0.proj.weight in transformer/diffusion_pytorch_model-\\d+-of-\\d+.safetensors is \\[768,288\\], expected \\[769,288\\]',
      ),
    );

    const noCheckpoint = await failure(
      await spoiled((to) => rmSync(join(to, 'transformer/diffusion_pytorch_model.safetensors.index.json'))),
    );
    expect(noCheckpoint.message).toBe(
      'transformer/ has neither diffusion_pytorch_model.safetensors nor diffusion_pytorch_model.safetensors.index.json: is it a diffusers model folder?',
    );
  });
});

describe("a model folder's files over HTTP", () => {
  it('a range is streamed into one buffer of the bytes asked for: the bytes of the file, fewer where it ends first, and refused where the server sends more', async () => {
    const file = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7) % 256);
    let extra = 0;
    const server: Server = await new Promise((resolve) => {
      const s = createServer((req, res) => {
        const [begin, asked] = (/^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? '') ?? []).slice(1).map(Number);
        const last = Math.min(asked, file.length - 1);
        res.writeHead(206, { 'Content-Range': `bytes ${begin}-${last}/${file.length}` });
        // in pieces, as a large answer arrives
        for (let at = begin; at <= last; at += 100) res.write(file.subarray(at, Math.min(at + 100, last + 1)));
        res.end(new Uint8Array(extra));
      });
      s.listen(0, '127.0.0.1', () => resolve(s));
    });
    try {
      const files = fetchModelFiles(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
      expect(await files.readRange('w.safetensors', 150, 870)).toEqual(file.subarray(150, 870));
      expect(await files.readRange('w.safetensors', 900, 1200)).toEqual(file.subarray(900));
      extra = 1;
      await expect(files.readRange('w.safetensors', 150, 870)).rejects.toThrow(
        'asked for bytes 150-869, the server sent more bytes as "bytes 150-869/1000"',
      );
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });

  it('a whole file past MAX_WHOLE_FILE_BYTES is refused by its Content-Length, before its body is read', async () => {
    const server: Server = await new Promise((resolve) => {
      const s = createServer((_req, res) => {
        res.writeHead(200, { 'Content-Length': String(MAX_WHOLE_FILE_BYTES + 1) });
        res.write(new Uint8Array(1024)); // and never the rest
      });
      s.listen(0, '127.0.0.1', () => resolve(s));
    });
    try {
      const { port } = server.address() as { port: number };
      const base = `http://127.0.0.1:${port}`;
      await expect(fetchModelFiles(base).read('transformer/config.json')).rejects.toThrow(
        `${base}/transformer/config.json is larger than ${MAX_WHOLE_FILE_BYTES} bytes`,
      );
    } finally {
      server.closeAllConnections();
      server.close();
    }
  });
});
