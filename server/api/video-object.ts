// A job as the API answers it: OpenAI's video object (id, object "video", status, progress, created_at, size,
// seconds, error) with what ditswarm knows beyond it (the prompt, frames, what is under way, the time left, the
// coordinator's report once done). openapi.ts describes the same shape.

import type { GenerateReport } from '../../coordinator/pipeline.ts';
import { DEFAULT_FPS } from '../../coordinator/video.ts';
import type { JobError, VideoJob, VideoStatus } from './job-db.ts';
import type { InputReference } from './video-request.ts';

export interface VideoObject {
  id: string;
  object: 'video';
  status: VideoStatus;
  /** 0–100 */
  progress: number;
  /** Unix seconds */
  created_at: number;
  started_at: number | null;
  completed_at: number | null;
  model: string | null;
  prompt: string;
  /** "WIDTHxHEIGHT": as asked, or the model's default once the job ran; null until known */
  size: string | null;
  frames: number | null;
  /** the video's length at the model's frame rate, as OpenAI gives it (a string) */
  seconds: string | null;
  /** what is under way */
  phase: string | null;
  eta_seconds: number | null;
  error: JobError | null;
  /** the coordinator's report, once completed */
  report: GenerateReport | null;
  /** runs started (a run a crash or a restart interrupted counts too) */
  attempts: number;
  /** the image a multipart POST gave, kept with the job; null where it gave none */
  input_reference: (InputReference & { note: string }) | null;
}

/** what a job given an image is told: what it is for, and what refuses it */
export const REFERENCE_NOTE =
  "the video's first frame, stretched to its size, on a Wan2.2 TI2V model; a model that makes video from text alone " +
  'fails the job, saying so';

const seconds = (ms: number | null) => (ms === null ? null : Math.floor(ms / 1000));

export function videoObject(job: VideoJob): VideoObject {
  const asked = job.request.overrides;
  const report = job.report as GenerateReport | null;
  const width = asked.width ?? report?.config.width;
  const height = asked.height ?? report?.config.height;
  const frames = asked.frames ?? report?.config.frames ?? null;
  return {
    id: job.id,
    object: 'video',
    status: job.status,
    progress: job.progress,
    created_at: Math.floor(job.createdAt / 1000),
    started_at: seconds(job.startedAt),
    completed_at: seconds(job.completedAt),
    model: asked.model ?? report?.config.model ?? null,
    prompt: asked.prompt ?? '',
    size: width && height ? `${width}x${height}` : null,
    frames,
    seconds: frames === null ? null : String((frames - 1) / DEFAULT_FPS || 1 / DEFAULT_FPS),
    phase: job.phase,
    eta_seconds: job.etaMs === null ? null : Math.round(job.etaMs / 1000),
    error: job.error,
    report: job.status === 'completed' ? report : null,
    attempts: job.attempts,
    input_reference: job.request.inputReference ? { ...job.request.inputReference, note: REFERENCE_NOTE } : null,
  };
}
