// A slower link than the one there is, for benchmarks and tests (issue 20): rank-to-rank links of
// a job that asks for it are paced as a LAN of a set bandwidth and latency would carry them, so a
// machine whose tabs talk over loopback can measure what the exchange costs between real machines.
// A page's links share one emulated wire, as its links share a machine's uplink: each frame leaves
// once the wire is free (its bytes over the bandwidth after the frame before it, on any of the
// links) and arrives the latency after that; until then it counts as buffered, so a Link's flow
// control sees the slow wire. It runs on timers, which a hidden tab throttles: for pages that
// are shown (benchmark and test tabs), not for real swarms.
import type { Channel } from './channel.ts';

export interface LinkEmulation {
  /** bytes a second a page sends: its uplink, shared by its links */
  bandwidth: number;
  /** one way, ms */
  latencyMs: number;
}

/** One page's uplink: the frames of all its paced channels go out on it one after another. */
export class EmulatedWire {
  /** when it has sent everything given it so far (performance.now() ms) */
  private freeAt = 0;

  constructor(readonly link: LinkEmulation) {}

  /** When a frame of `bytes` given it now arrives at the other end (performance.now() ms). */
  schedule(bytes: number): number {
    this.freeAt = Math.max(performance.now(), this.freeAt) + (bytes / this.link.bandwidth) * 1000;
    return this.freeAt + this.link.latencyMs;
  }
}

export class PacedChannel implements Channel {
  /** bytes sent but not yet handed to the real channel */
  private held = 0;
  private closed = false;
  private readonly lowListeners = new Set<() => void>();

  constructor(
    private readonly inner: Channel,
    private readonly wire: EmulatedWire,
  ) {
    inner.addEventListener('close', () => (this.closed = true));
  }

  get bufferedAmount(): number {
    return this.held + this.inner.bufferedAmount;
  }

  get bufferedAmountLowThreshold(): number {
    return this.inner.bufferedAmountLowThreshold;
  }

  set bufferedAmountLowThreshold(bytes: number) {
    this.inner.bufferedAmountLowThreshold = bytes;
  }

  send(data: ArrayBuffer): void {
    if (this.closed) throw new Error('the channel is closed');
    const due = this.wire.schedule(data.byteLength);
    this.held += data.byteLength;
    // due times only grow, so the frames reach the real channel in the order they were sent
    setTimeout(() => {
      this.held -= data.byteLength;
      if (this.closed) return;
      try {
        this.inner.send(data);
      } catch {
        return; // it closed meanwhile: its close event tells the Link
      }
      if (this.bufferedAmount <= this.bufferedAmountLowThreshold) for (const cb of this.lowListeners) cb();
    }, due - performance.now());
  }

  addEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    if (type === 'bufferedamountlow') this.lowListeners.add(cb);
    this.inner.addEventListener(type, cb);
  }

  removeEventListener(type: 'bufferedamountlow' | 'close', cb: () => void): void {
    if (type === 'bufferedamountlow') this.lowListeners.delete(cb);
    this.inner.removeEventListener(type, cb);
  }
}
