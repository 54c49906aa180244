// How much one client may ask of this server: so that one page, or one machine of the LAN, cannot
// take what the others need (signaling slots and messages, join links).
import { isIPv4, isIPv6 } from 'node:net';

interface Bucket {
  level: number;
  at: number;
}

/** Refills `bucket` for the time since it was last looked at (`count` per `windowMs`, up to `count`). */
function refill(bucket: Bucket, now: number, count: number, windowMs: number): Bucket {
  bucket.level = Math.min(count, bucket.level + ((now - bucket.at) * count) / windowMs);
  bucket.at = now;
  return bucket;
}

/** A limit of `count` events per `windowMs`, in bursts of up to `count`: returns whether this event is within it. */
export function rateLimit(count: number, windowMs: number): () => boolean {
  const bucket = { level: count, at: Date.now() };
  return () => {
    refill(bucket, Date.now(), count, windowMs);
    if (bucket.level < 1) return false;
    bucket.level -= 1;
    return true;
  };
}

/** rateLimit for each address apart: returns whether this event from `address` is within its limit. */
export function perAddressLimit(count: number, windowMs: number): (address: string) => boolean {
  const buckets = new Map<string, Bucket>();
  return (address) => {
    const now = Date.now();
    // a full bucket is the same as none: forget those, so the map holds only addresses that asked lately
    for (const [other, b] of buckets) if (refill(b, now, count, windowMs).level >= count) buckets.delete(other);
    const bucket = buckets.get(address) ?? { level: count, at: now };
    buckets.set(address, bucket);
    if (bucket.level < 1) return false;
    bucket.level -= 1;
    return true;
  };
}

/**
 * At most `max` things open at once for each address: whether one more may open, as the function
 * that gives its place back.
 */
export function perAddressCap(max: number): (address: string) => (() => void) | null {
  const open = new Map<string, number>();
  return (address) => {
    const n = open.get(address) ?? 0;
    if (n >= max) return null;
    open.set(address, n + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = (open.get(address) ?? 1) - 1;
      if (left > 0) open.set(address, left);
      else open.delete(address);
    };
  };
}

/**
 * Where a client connects from, as the limits count it: `address` one machine's (every loopback
 * address, 127.0.0.0/8 and ::1, is one: the server's own machine), `prefix` its network's (an
 * IPv4 /24, an IPv6 /64), which one machine can fill with as many addresses as it likes.
 */
export interface ClientSource {
  address: string;
  prefix: string;
}

const LOOPBACK: ClientSource = { address: 'loopback', prefix: 'loopback' };

/** Whether a client is the server's own machine (any of its loopback addresses). */
export const isLoopback = (source: ClientSource): boolean => source.address === LOOPBACK.address;

export function clientSource(remoteAddress: string | undefined): ClientSource {
  const address = (remoteAddress ?? '').toLowerCase().replace(/%.*$/, '');
  if (isIPv4(address)) {
    if (address.startsWith('127.')) return LOOPBACK;
    return { address, prefix: `${address.split('.').slice(0, 3).join('.')}.0/24` };
  }
  if (!isIPv6(address)) return { address, prefix: address };
  const groups = ipv6Groups(address);
  const hex = (part: number[]) => part.map((g) => g.toString(16)).join(':');
  if (hex(groups.slice(0, 6)) === '0:0:0:0:0:ffff')
    // an IPv4 client of a dual-stack socket
    return clientSource([groups[6] >> 8, groups[6] & 255, groups[7] >> 8, groups[7] & 255].join('.'));
  if (hex(groups) === '0:0:0:0:0:0:0:1') return LOOPBACK;
  return { address: hex(groups), prefix: `${hex(groups.slice(0, 4))}::/64` };
}

/** the eight 16-bit groups of an IPv6 address (`::` expanded, a trailing dotted IPv4 as two groups) */
function ipv6Groups(address: string): number[] {
  const dotted = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(address);
  const text = dotted
    ? address.slice(0, dotted.index) +
      [(+dotted[1] << 8) | +dotted[2], (+dotted[3] << 8) | +dotted[4]].map((g) => g.toString(16)).join(':')
    : address;
  const halves = text.split('::');
  const parse = (part: string | undefined) => (part ? part.split(':').map((g) => parseInt(g, 16)) : []);
  const [before, after] = [parse(halves[0]), parse(halves[1])];
  return halves.length === 1
    ? before
    : [...before, ...Array<number>(8 - before.length - after.length).fill(0), ...after];
}
