// How much one client may ask of this server: so that one page, or one machine of the LAN, cannot
// take what the others need (signaling slots and messages, join links).

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
