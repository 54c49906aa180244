// Checks for values that came from a peer. Nothing a peer sends is trusted, so every value is
// checked where it arrives rather than cast: each check returns the value with its type, or throws
// a ContractError that says where in the value, what was expected and what came. An object check
// keeps only the fields it names, so nothing unexpected travels further.

export class ContractError extends Error {
  override name = 'ContractError';
}

/** Returns `value` as a T, or throws a ContractError naming `at` (the path to it, for the message). */
export type Check<T> = (value: unknown, at: string) => T;

function describe(value: unknown): string {
  if (value instanceof Float32Array) return `a Float32Array of ${value.length}`;
  if (Array.isArray(value)) return `an array of ${value.length}`;
  if (value === null) return 'null';
  if (typeof value === 'string') return JSON.stringify(value.length > 40 ? `${value.slice(0, 40)}…` : value);
  switch (typeof value) {
    case 'object':
      return `an object with ${Object.keys(value).slice(0, 6).join(', ') || 'no fields'}`;
    case 'number':
    case 'boolean':
    case 'bigint':
    case 'undefined':
      return `${typeof value} ${String(value)}`;
    default:
      // a function or a symbol: no peer can send one, and a function's text may be long
      return `a ${typeof value}`;
  }
}

export function fail(at: string, expected: string, value: unknown): never {
  throw new ContractError(`${at}: expected ${expected}, got ${describe(value)}`);
}

/** A finite number in [min, max]. */
export const num =
  (min = -Infinity, max = Infinity): Check<number> =>
  (v, at) =>
    typeof v === 'number' && Number.isFinite(v) && v >= min && v <= max
      ? v
      : fail(at, `a finite number in [${min}, ${max}]`, v);

/** An integer in [min, max]. */
export const int =
  (min = Number.MIN_SAFE_INTEGER, max = Number.MAX_SAFE_INTEGER): Check<number> =>
  (v, at) =>
    Number.isInteger(v) && (v as number) >= min && (v as number) <= max
      ? (v as number)
      : fail(at, `an integer in [${min}, ${max}]`, v);

export const text =
  (maxLength = 4096): Check<string> =>
  (v, at) =>
    typeof v === 'string' && v.length <= maxLength ? v : fail(at, `a string of at most ${maxLength} characters`, v);

/** `bytes` bytes as lowercase hex digits (a key, a digest, a signature). */
export const hexOf =
  (bytes: number): Check<string> =>
  (v, at) =>
    typeof v === 'string' && v.length === 2 * bytes && /^[0-9a-f]*$/.test(v)
      ? v
      : fail(at, `${bytes} bytes as ${2 * bytes} lowercase hex digits`, v);

/** A Float32Array of at most `maxLength` values. */
export const floats =
  (maxLength = 1 << 28): Check<Float32Array> =>
  (v, at) =>
    v instanceof Float32Array && v.length <= maxLength
      ? v
      : fail(at, `a Float32Array of at most ${maxLength} values`, v);

export function oneOf<const T extends readonly (string | number | boolean | null)[]>(...values: T): Check<T[number]> {
  return (v, at) =>
    values.includes(v as T[number])
      ? (v as T[number])
      : fail(at, `one of ${values.map((x) => JSON.stringify(x)).join(', ')}`, v);
}

export function list<T>(item: Check<T>, { min = 0, max = 4096 } = {}): Check<T[]> {
  return (v, at) => {
    if (!Array.isArray(v) || v.length < min || v.length > max) fail(at, `an array of ${min} to ${max} items`, v);
    return v.map((x, i) => item(x, `${at}[${i}]`));
  };
}

export function optional<T>(check: Check<T>): Check<T | undefined> {
  return (v, at) => (v === undefined ? undefined : check(v, at));
}

export function nullable<T>(check: Check<T>): Check<T | null> {
  return (v, at) => (v === null ? null : check(v, at));
}

/**
 * One check per field of T, its optional fields included: a field left out of a `fields` call does
 * not compile, so no field of T can silently vanish from what the check lets through.
 */
export type FieldChecks<T> = { [K in keyof T]-?: Check<T[K]> };

/**
 * An object with exactly the fields of T, each checked (a field whose check allows undefined may be
 * absent); other fields are dropped. T comes from where the check is used (`const c: Check<T> =
 * fields({...})`), never from the checks given, so the checks are held to T rather than T to them.
 */
export function fields<T extends object = never>(shape: FieldChecks<NoInfer<T>>): Check<T> {
  const checks: [string, Check<unknown>][] = Object.entries(shape);
  return (v, at) => {
    if (!v || typeof v !== 'object' || Array.isArray(v) || ArrayBuffer.isView(v))
      fail(at, `an object with ${Object.keys(shape).join(', ') || 'no fields'}`, v);
    const out: Record<string, unknown> = {};
    for (const [key, check] of checks) {
      const value = check((v as Record<string, unknown>)[key], `${at}.${key}`);
      if (value !== undefined) out[key] = value;
    }
    return out as T;
  };
}

/** No arguments: nothing, or an empty object. */
export const none: Check<Record<string, never>> = (v, at) =>
  v === undefined || v === null || (typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length === 0)
    ? {}
    : fail(at, 'no arguments', v);

/**
 * `value` as a T if it passes, else undefined: for advisory fields (a pulse's), where a bad value is
 * dropped, not its sender.
 */
export function passing<T>(check: Check<T>, value: unknown, at: string): T | undefined {
  try {
    return check(value, at);
  } catch {
    return undefined;
  }
}
