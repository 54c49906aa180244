// The automation API: what `npm run generate`, the benchmarks and the e2e tests drive through
// page.evaluate. The pages implement these types and the drivers call them, so the two sides cannot drift.
// Types only: what crosses page.evaluate is plain data, so tensors go as base64.
import type {
  GenerateReport,
  JobEstimate,
  JobParams,
  JobPlacement,
  QueueEvent,
  StoredJob,
  TimeLeft,
} from '../coordinator/index.ts';
import type { DecodeReport } from '../coordinator/vae-decoding.ts';
import type { WebMProbe } from '../coordinator/video.ts';
import type { WorkerStatus } from '../worker/endpoint.ts';
import type { Transport } from '../core/net/channel.ts';

/** Float32 values as page.evaluate carries them: the shape, and the values in base64. */
export interface Base64Floats {
  shape: number[];
  base64: string;
}

/** An image file as page.evaluate carries it: its type (image/png, image/jpeg, image/webp) and its bytes in base64. */
export interface Base64Image {
  type: string;
  base64: string;
}

/** A job as submitted through the automation API: the form's values beneath, these over them. */
export type JobOverrides = Partial<JobParams> &
  Partial<JobPlacement> & {
    /** prompt embeddings instead of the prompt (WanPipeline's prompt_embeds=) */
    promptEmbeds?: Base64Floats;
    negativePromptEmbeds?: Base64Floats;
    /** 'latent' stops before the VAE */
    outputType?: 'video' | 'latent';
    /** an image to start the video from (a Wan2.2 TI2V folder's image to video) */
    image?: Base64Image;
  };

/** A settled job: its report, its final latent and (unless it asked for the latent only) its WebM, in base64. */
export interface JobResult {
  report: GenerateReport;
  latent: string;
  video: string | null;
}

/** A job as the queue lists it. */
export interface JobSummary {
  id: number;
  status: StoredJob['status'];
  prompt: string;
  /** steps done, by its checkpoint */
  step: number | null;
  error?: string;
}

/** A latent through the model's VAE alone: the job of `npm run decode`. */
export interface DecodeRequest {
  model?: string;
  /** [z_dim, T, h, w] */
  latent: Base64Floats;
  ep?: 'auto' | 'webgpu' | 'wasm';
  /** the WebM too, as a job makes it */
  webm?: boolean;
}

export interface DecodeOutcome {
  report: DecodeReport;
  /** [3, F, 8h, 8w] in [−1, 1] */
  video: Base64Floats;
  webm: string | null;
}

/** A worker of the swarm, as the dashboard's swarm table shows it. */
export interface WorkerSummary {
  id: string;
  /** where it computes with ep 'auto': the EP it measured faster; null while it is measured */
  ep: 'webgpu' | 'wasm' | null;
  threads: number;
  /** its GPU adapter, as its browser names it */
  adapter: string;
  /** its link to the coordinator: a data channel, or through the server's relay */
  transport: Transport;
  /** what it is doing: 'idle', or the executor's activity ('computing step 3', …) */
  state: string;
  /** a tab of the coordinator's own browser */
  thisMachine: boolean;
}

/** The links a swarm's workers join with, on this machine and on the LAN. */
export interface JoinLinks {
  joinUrl: string;
  lanJoinUrl: string;
}

/** `window.ditswarm` on the dashboard. */
export interface DashboardAutomation {
  /** settles once the swarm is open and the queue restored */
  ready: Promise<JoinLinks & { swarmId: string }>;
  workerCount(): number;
  workers(): WorkerSummary[];
  /** a new worker link; null when the old one could not be revoked (the page says why) */
  revokeJoinLink(): Promise<JoinLinks | null>;
  /** peer ids of the running executor's ranks, in rank order */
  ranks(): string[];
  jobs(): JobSummary[];
  /** queues a job; its id */
  submit(overrides: JobOverrides): Promise<number>;
  /** what the job would take on the swarm as it is now, phase by phase; rejects where it cannot be told now */
  estimate(overrides: JobOverrides): Promise<JobEstimate>;
  /** stops a job: a queued one never starts, a running one stops at its next step */
  cancel(id: number): Promise<void>;
  /** stops the job if it has not settled, then deletes it with its checkpoint and video from the page's store */
  discard(id: number): Promise<void>;
  /** the job's outcome once it settles; rejects with its error if it failed */
  result(id: number): Promise<JobResult>;
  /** a job through the queue; with `stepLatents`, the latent after each step too (base64) */
  generate(
    overrides: JobOverrides,
    options?: { stepLatents?: boolean },
  ): Promise<JobResult & { stepLatents: string[] | null }>;
  decode(request: DecodeRequest): Promise<DecodeOutcome>;
  /** workers joining from now on preload a model of at least this many bytes (PRELOAD_FROM_BYTES unless set) */
  preloadFrom(bytes: number): void;
  /** what the page's <video> and the WebM file itself say about the video on show */
  inspectVideo(): Promise<{
    duration: number;
    videoWidth: number;
    videoHeight: number;
    file: WebMProbe;
    download: string;
  }>;
}

/** What the dashboard tells `window.ditswarmProgress`, when a driver exposed it. */
export type AutomationProgress =
  | { job: number; step: number; steps: number; stepMs: number; etaMs: number }
  | { job: number; phase: Extract<QueueEvent, { type: 'phase' }>['phase']; detail?: string; left: TimeLeft }
  /** a decode alone is no job */
  | { phase: 'decoding'; detail: string };

/** `window.ditswarmWorker` on a worker page: its status as last shown. */
export type WorkerAutomation = WorkerStatus;

declare global {
  interface Window {
    /** on the dashboard only */
    ditswarm: DashboardAutomation;
    /** set by a driver (page.exposeFunction); looked up at each event, so it may come at any time */
    ditswarmProgress?: (progress: AutomationProgress) => unknown;
    /** on a worker page, once it has a status */
    ditswarmWorker?: WorkerAutomation;
    /** on a worker page: every state it went through, as "state: detail" */
    ditswarmWorkerHistory: string[];
  }
}
