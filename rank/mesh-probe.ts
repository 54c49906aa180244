// How fast this rank's all-to-all is, measured on the job's own mesh before its first step: two
// exchanges of one float per peer (the latency; the faster counts) and one of PROBE_FLOATS per
// peer (latency + bytes). Every rank sends to every other at once, as in a Ulysses exchange, so
// the fit is the bandwidth a rank actually gets while all links are busy.
import { payloadBytes } from '../core/net/protocol.ts';
import type { MeshProbe } from '../core/worker-api.ts';
import { ExchangePhase, type Exchange } from './ulysses.ts';

export const PROBE_FLOATS = [1, 1, 128 * 1024] as const;

export async function probeMesh(exchange: Exchange, job: number): Promise<MeshProbe> {
  const times: number[] = [];
  for (const [step, floats] of PROBE_FLOATS.entries()) {
    const parts = Array.from({ length: exchange.world }, () => new Float32Array(floats));
    const start = performance.now();
    await exchange.allToAll({ job, step, pass: 0, block: 0, phase: ExchangePhase.Probe, group: 0 }, parts);
    times.push(performance.now() - start);
  }
  const bytes = (floats: number) => payloadBytes(floats, exchange.dtype);
  return {
    rank: exchange.rank,
    bytesPerPeer: bytes(PROBE_FLOATS[2]),
    smallBytes: bytes(PROBE_FLOATS[0]) * (exchange.world - 1),
    bytesSent: bytes(PROBE_FLOATS[2]) * (exchange.world - 1),
    smallMs: Math.min(times[0], times[1]),
    largeMs: times[2],
  };
}
