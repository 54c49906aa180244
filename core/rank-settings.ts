// What every rank of a placement is told besides its place in the mesh. The planner
// (coordinator/planner.ts) decides each field once; the worker contract checks them as they arrive
// (core/worker-api.ts initWorker), and the ranks read them as they are: nobody fills in a default.
import { fields, int, nullable, num, oneOf, type FieldChecks } from './net/check.ts';
import type { LinkEmulation } from './net/paced-channel.ts';
import { DTYPES, type DType } from './net/protocol.ts';
import type { ParallelMode } from './parallel.ts';

export interface RankSettings {
  /** how activations travel between ranks: float32 (exact), float16, int8, or int4 (displaced deltas only) */
  dtype: DType;
  /** how a group's ranks share self-attention: Ulysses (exact) or displaced (one step stale: rank/displaced.ts) */
  parallel: ParallelMode;
  /** Ulysses: the head groups a block's exchange goes in (core/parallel.ts headGroup); 1 in displaced mode */
  headGroups: number;
  /** the rank's links to the other ranks paced as this slower link (benchmarks and tests), or null */
  emulateLink: LinkEmulation | null;
}

const MAX_HEAD_GROUPS_ON_THE_WIRE = 1024;

/** A check for every field of RankSettings: a field added there without one here does not compile. */
export const RANK_SETTINGS_CHECKS: FieldChecks<RankSettings> = {
  dtype: oneOf(...DTYPES),
  parallel: oneOf('ulysses', 'displaced'),
  headGroups: int(1, MAX_HEAD_GROUPS_ON_THE_WIRE),
  emulateLink: nullable(fields({ bandwidth: num(1e4, 1e12), latencyMs: num(0, 10_000) })),
};
