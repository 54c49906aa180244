// The demo model scored as eval-demo and the benchmarks score it: each combination of colour, shape
// and direction sampled at each seed (the pipeline's sampler in Node, through the ONNX stage graphs
// workers run), decoded, and read by the detector; the shares of videos whose colour, direction and
// both it read as the prompt asked.
import { detect } from './detector.ts';
import { sampleVideo, type LoadedModel, type SampleParams } from './generate.ts';
import { CLIP, promptOf, type Combo } from './world.ts';

export interface PromptResult {
  prompt: string;
  seed: number;
  colour: string;
  direction: string;
  detected: { colour: string; direction: string; dx: number; dy: number; area: number };
  colourCorrect: boolean;
  directionCorrect: boolean;
}

/** How each video is sampled beside its prompt, seed and the clip size the model was trained on. */
export type DemoSampling = Omit<SampleParams, 'prompt' | 'negativePrompt' | 'seed' | 'frames' | 'height' | 'width'>;

export async function evaluateDemo(
  model: LoadedModel,
  combos: readonly Combo[],
  seeds: readonly number[],
  sampling: DemoSampling,
  onResult: (result: PromptResult) => void = () => {},
) {
  const results: PromptResult[] = [];
  for (const combo of combos) {
    const prompt = promptOf(combo);
    for (const seed of seeds) {
      const { video } = await sampleVideo(model, { ...sampling, ...CLIP, prompt, negativePrompt: '', seed });
      const seen = detect(video);
      const result: PromptResult = {
        prompt,
        seed,
        colour: combo.colour,
        direction: combo.direction,
        detected: {
          colour: seen.colour,
          direction: seen.direction,
          dx: +seen.dx.toFixed(2),
          dy: +seen.dy.toFixed(2),
          area: +seen.area.toFixed(1),
        },
        colourCorrect: seen.colour === combo.colour,
        directionCorrect: seen.direction === combo.direction,
      };
      results.push(result);
      onResult(result);
    }
  }
  const share = (ok: (r: PromptResult) => boolean) => results.filter(ok).length / results.length;
  return {
    results,
    colorAccuracy: share((r) => r.colourCorrect),
    directionAccuracy: share((r) => r.directionCorrect),
    bothAccuracy: share((r) => r.colourCorrect && r.directionCorrect),
  };
}
