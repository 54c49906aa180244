import { describe, expect, it } from 'vitest';
import { DEFAULT_JOB, checkJobParams, jobParams } from '../../core/job.ts';
import { latentShape, wan21Latent } from '../../core/model/family.ts';
import type { ModelFiles } from '../../core/model/files.ts';
import {
  loadWanPipelineParts,
  WAN_NEGATIVE_PROMPT,
  WAN_SIZES,
  WAN_TEXT_TOKENS,
} from '../../core/model/wan-pipeline.ts';
import { WAN21_T2V_1_3B } from '../../server/wan21-layout.ts';
import { tinyModelFiles } from './fixtures.ts';

/** the tiny model's folder with some of its JSON files replaced */
const withJson = (replaced: Record<string, unknown>): ModelFiles => ({
  ...tinyModelFiles,
  read: async (path) =>
    path in replaced ? new TextEncoder().encode(JSON.stringify(replaced[path])) : tinyModelFiles.read(path),
});

/** the classes of a published Wan2.1 folder: umT5, AutoencoderKLWan, UniPC (its flow shift in the scheduler config) */
const PUBLISHED = {
  'model_index.json': WAN21_T2V_1_3B.modelIndex,
  'text_encoder/config.json': WAN21_T2V_1_3B.textEncoder,
  'vae/config.json': WAN21_T2V_1_3B.vae,
  'scheduler/scheduler_config.json': WAN21_T2V_1_3B.scheduler,
};

describe("a model folder's job defaults", () => {
  it("a folder of the published classes gets WanPipeline's: 480×832, 81 frames, 50 steps, guidance 5, the example's negative prompt, its scheduler's shift 3", async () => {
    const { defaults, textTokens } = await loadWanPipelineParts(withJson(PUBLISHED));
    expect(defaults).toEqual({
      prompt: DEFAULT_JOB.prompt,
      negativePrompt: WAN_NEGATIVE_PROMPT,
      frames: 81,
      height: 480,
      width: 832,
      steps: 50,
      guidance: 5,
      seed: DEFAULT_JOB.seed,
      flowShift: 3,
      scheduler: 'folder',
    });
    expect(textTokens).toBe(WAN_TEXT_TOKENS);
    expect(WAN_TEXT_TOKENS).toBe(512);
    expect(checkJobParams({}, defaults)).toEqual({});
    // 81 frames → 21 latent frames, as Wan2.1 makes them
    expect(latentShape(defaults, wan21Latent(16))).toEqual([16, 21, 60, 104]);
  });

  it("the negative prompt is diffusers' Wan example's: 28 phrases from 'Bright tones' to 'walking backwards'", () => {
    expect(WAN_NEGATIVE_PROMPT.startsWith('Bright tones, overexposed, static, blurred details, subtitles,')).toBe(true);
    expect(WAN_NEGATIVE_PROMPT.endsWith('three legs, many people in the background, walking backwards')).toBe(true);
    expect(WAN_NEGATIVE_PROMPT.split(', ')).toHaveLength(28);
  });

  it('the tiny models keep DEFAULT_JOB, and so does a folder with only some published parts (no UniPC: not what WanPipeline runs)', async () => {
    expect((await loadWanPipelineParts(tinyModelFiles)).defaults).toEqual(DEFAULT_JOB);
    const withoutScheduler = Object.fromEntries(
      Object.entries(PUBLISHED).filter(([path]) => path !== 'scheduler/scheduler_config.json'),
    );
    expect((await loadWanPipelineParts(withJson(withoutScheduler))).defaults).toEqual(DEFAULT_JOB);
  });

  it("a request's fields win over the folder's defaults; the rest are the folder's", async () => {
    const { defaults } = await loadWanPipelineParts(withJson(PUBLISHED));
    const asked = { prompt: 'a cat and a dog baking a cake', ...WAN_SIZES['720p'], steps: 4, negativePrompt: '' };
    expect(jobParams(asked, defaults)).toEqual({
      ...asked,
      frames: 81,
      guidance: 5,
      seed: DEFAULT_JOB.seed,
      height: 720,
      width: 1280,
      flowShift: 5,
      scheduler: 'folder',
    });
    expect(jobParams({}, defaults)).toEqual(defaults);
    // a folder's defaults beneath do not excuse a bad field
    expect(() => jobParams({ frames: 80 }, defaults)).toThrow('frames: must be 4k+1 (1, 5, 9, 13, …), got 80; try 81');
  });

  it("a folder's own flow shift is its default (model_index.json's before its scheduler's)", async () => {
    const shifted = await loadWanPipelineParts(
      withJson({ ...PUBLISHED, 'scheduler/scheduler_config.json': { ...WAN21_T2V_1_3B.scheduler, flow_shift: 5.0 } }),
    );
    expect(shifted.defaults.flowShift).toBe(5);
    const tiny = await loadWanPipelineParts(
      withJson({ 'model_index.json': { _class_name: 'WanPipeline', flow_shift: 7 } }),
    );
    expect(tiny.defaults).toEqual({ ...DEFAULT_JOB, flowShift: 7 });
  });

  it('both Wan sizes are within the limits of a job: 720p at 81 frames is a valid job', () => {
    for (const size of Object.values(WAN_SIZES)) expect(checkJobParams({ ...size, frames: 81 })).toEqual({});
    expect(WAN_SIZES).toEqual({
      '480p': { height: 480, width: 832, flowShift: 3 },
      '720p': { height: 720, width: 1280, flowShift: 5 },
    });
  });
});
