// For values an invariant guarantees (a key just set, a rank inside the layout): where `!` would
// let a broken invariant surface later as a TypeError far away, this fails where it broke.

/** `value`, or an Error naming what was missing. */
export function defined<T>(value: T | null | undefined, what: string): T {
  if (value === null || value === undefined) throw new Error(`${what} is missing`);
  return value;
}
