// The numeric job parameters as command-line flags (`--frames 9 --steps 20`), for every command
// that runs jobs: the parseArgs options, and the parsed values back as job fields.

import type { JobParams } from '../../core/job.ts';

export type JobFlag = 'frames' | 'height' | 'width' | 'steps' | 'guidance' | 'seed';

export const JOB_FLAG_OPTIONS = {
  frames: { type: 'string' },
  height: { type: 'string' },
  width: { type: 'string' },
  steps: { type: 'string' },
  guidance: { type: 'string' },
  seed: { type: 'string' },
} as const satisfies Record<JobFlag, { type: 'string' }>;

/** The job fields among parsed flags, as numbers; a flag not given stays absent. */
export function jobFlagValues(values: Partial<Record<JobFlag, string>>): Partial<Pick<JobParams, JobFlag>> {
  const out: Partial<Pick<JobParams, JobFlag>> = {};
  for (const key of Object.keys(JOB_FLAG_OPTIONS) as JobFlag[])
    if (values[key] !== undefined) out[key] = Number(values[key]);
  return out;
}

/**
 * The Ulysses degree of each stage (of each CFG group) that `total` workers make: with CFG parallel each of the two
 * groups runs every stage, each stage on the same number of workers. null where they cannot be shared so.
 */
export function degreeOfWorkers(total: number, stages: number, cfgParallel: boolean): number | null {
  const perStage = stages * (cfgParallel ? 2 : 1);
  return total % perStage ? null : total / perStage;
}
