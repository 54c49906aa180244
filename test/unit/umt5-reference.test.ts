// core/model/umt5.ts held to transformers' UMT5EncoderModel as the upstream Python runs it:
// umt5.fixture.json is what test/reference/umt5_numpy.py (a line-by-line numpy float64
// transcription of modeling_umt5.py's encoder) gives for a tiny seeded encoder in the published
// layout. The port's plain-TS reference and its ONNX graph read one name map, so a test between
// them cannot see a swapped tensor; this one can. Regenerate it with
// `npx tsx test/reference/make-umt5-fixture.ts`; this test makes the same weights without Python.

import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { encodeIds, openUmt5, umt5LayerReference, type Umt5Checkpoint } from '../../core/model/umt5.ts';
import { onnxUmt5Layers } from '../../rank/umt5-layers.ts';
import { folderFiles } from '../../server/model-folder.ts';
import { CASES, FIXTURE_PATH, INIT, SEED, TINY_UMT5_CONFIG, writeTinyUmt5 } from '../reference/make-umt5-fixture.ts';

const fixture = JSON.parse(readFileSync(FIXTURE_PATH, 'utf8')) as {
  config: Record<string, unknown>;
  seed: string;
  init: string;
  cases: { name: string; ids: number[]; shape: number[]; lastHiddenState: number[] }[];
};

/**
 * float32 against float64, relative to the output's largest value: the port lands within about 1e-6. The
 * narrowest plausible bugs land past ten times it: the erf GELU for gelu_new (1.3e-4), the published eps
 * for the config's (3.3e-3), wi_0 and wi_1 swapped (further still).
 */
const TOLERANCE = 1e-5;

let dir: string;
let encoder: Umt5Checkpoint;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'ditswarm-umt5-reference-'));
  await writeTinyUmt5(dir);
  encoder = await openUmt5(folderFiles(dir));
}, 60_000);
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function relativeError(got: Float32Array, want: number[]): number {
  const scale = Math.max(...want.map(Math.abs));
  return want.reduce((m, v, i) => Math.max(m, Math.abs(got[i] - v)), 0) / scale;
}

describe("umT5 against transformers' UMT5EncoderModel (numpy transcription of modeling_umt5.py)", () => {
  it('uses the fixture as it was made', () => {
    expect(fixture.config).toEqual(TINY_UMT5_CONFIG);
    expect([fixture.seed, fixture.init]).toEqual([SEED, INIT]);
    expect(fixture.cases.map((c) => c.ids)).toEqual(CASES.map((c) => c.ids));
  });

  it(`the plain-TS reference and the ONNX layers give last_hidden_state within ${TOLERANCE} of its largest value`, async () => {
    const onnx = await onnxUmt5Layers(encoder.config, 'wasm');
    for (const c of fixture.cases) {
      expect(c.shape).toEqual([c.ids.length, encoder.config.dModel]);
      const reference = await encodeIds(encoder, c.ids, (w, h, b) =>
        Promise.resolve(umt5LayerReference(encoder.config, w, h, b)),
      );
      const graph = await encodeIds(encoder, c.ids, (w, h, b) => onnx.run(w, h, b));
      const errors = [relativeError(reference, c.lastHiddenState), relativeError(graph, c.lastHiddenState)];
      console.log(`umT5 ${c.name}: reference ${errors[0].toExponential(2)}, onnx ${errors[1].toExponential(2)}`);
      for (const error of errors) expect(error, c.name).toBeLessThan(TOLERANCE);
    }
  }, 60_000);

  it('fails the narrowest plausible bugs by far more than 10× its tolerance', async () => {
    const c = fixture.cases[2];
    const cfg = encoder.config;
    const run = (bend: Partial<Umt5Checkpoint>, config = cfg) =>
      encodeIds({ ...encoder, ...bend }, c.ids, (w, h, b) => Promise.resolve(umt5LayerReference(config, w, h, b)));
    const swapped = await run({
      layer: async (i) => {
        const w = await encoder.layer(i);
        return { ...w, wi0: w.wi1, wi1: w.wi0 };
      },
    });
    const publishedEps = await run({ config: { ...cfg, eps: 1e-6 } }, { ...cfg, eps: 1e-6 });
    for (const [bug, out] of [
      ['wi_0 and wi_1 swapped', swapped],
      ['the published eps, not the config one', publishedEps],
    ] as const)
      expect(relativeError(out, c.lastHiddenState), bug).toBeGreaterThan(10 * TOLERANCE);
  });
});
