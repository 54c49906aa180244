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

/**
 * One page's uplink: the frames of all its paced channels go out on it one after another, in the
 * order they were sent, through one queue and one timer (timers of their own could fire out of
 * order: a browser clamps some delays to 4 ms).
 */
export class EmulatedWire {
  /** when it has sent everything given it so far (performance.now() ms) */
  private freeAt = 0;
  private readonly queue: { due: number; deliver: () => void }[] = [];
  private timer: ReturnType<typeof setTimeout> | null = null;

  constructor(readonly link: LinkEmulation) {}

  /** Runs `deliver` when a frame of `bytes` given it now has crossed the wire and its latency. */
  carry(bytes: number, deliver: () => void): void {
    this.freeAt = Math.max(performance.now(), this.freeAt) + (bytes / this.link.bandwidth) * 1000;
    this.queue.push({ due: this.freeAt + this.link.latencyMs, deliver });
    this.arm();
  }

  private arm(): void {
    if (this.timer !== null || !this.queue.length) return;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        // a timer may fire a little early or late: everything due by now goes, in order
        const now = performance.now() + 1;
        for (let head = this.queue.at(0); head && head.due <= now; head = this.queue.at(0)) {
          this.queue.shift();
          head.deliver();
        }
        this.arm();
      },
      Math.max(0, this.queue[0].due - performance.now()),
    );
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
    this.held += data.byteLength;
    this.wire.carry(data.byteLength, () => {
      this.held -= data.byteLength;
      if (this.closed) return;
      try {
        this.inner.send(data);
      } catch {
        return; // it closed meanwhile: its close event tells the Link
      }
      if (this.bufferedAmount <= this.bufferedAmountLowThreshold) for (const cb of this.lowListeners) cb();
    });
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
