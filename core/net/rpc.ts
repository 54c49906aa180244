// Typed request/reply over a Link, in the spirit of comlink's Remote<T>: one side serves an
// implementation of an API, the other calls it through `remote()`, and both are typed by the same
// interface. A contract (one args check and one reply check per method) judges every request where
// it is served and every reply where it arrives, so a peer's value is checked, never cast. Any
// Float32Array in a value travels as binary, never as JSON numbers. Malformed bodies are ignored:
// a peer cannot crash the other side.
import { ContractError, type Check } from './check.ts';
import type { Link } from './link.ts';
import type { Message } from './protocol.ts';

/** Both halves of one method's contract. */
export type MethodContract<Args, Reply> = { args: Check<Args>; reply: Check<Reply> };

/** A check for the arguments and for the reply of every method of Api (each takes one argument object). */
export type ApiContract<Api> = {
  [M in keyof Api]: Api[M] extends (args: infer A) => Promise<infer R> ? MethodContract<A, R> : never;
};

/** How the calling side sees Api: each method takes its arguments and an optional timeout. */
export type Remote<Api> = {
  [M in keyof Api]: Api[M] extends (args: infer A) => Promise<infer R>
    ? (args: A, timeoutMs?: number) => Promise<R>
    : never;
};

type Body =
  | { type: 'request'; id: number; method: string; args: unknown }
  | { type: 'reply'; id: number; ok: true; result: unknown }
  // a peer's error may be anything: it is made text where it arrives
  | { type: 'reply'; id: number; ok: false; error: unknown; detail?: unknown };

export const DEFAULT_RPC_TIMEOUT_MS = 60_000;
/** a call that waits for its answer however long it takes: its caller judges it by other evidence */
export const NO_RPC_TIMEOUT = Infinity;

/** Rejects through `onTimeout` after `timeoutMs`, unless that is NO_RPC_TIMEOUT; the timer, to clear. */
function deadline(timeoutMs: number, onTimeout: () => void): ReturnType<typeof setTimeout> | undefined {
  return Number.isFinite(timeoutMs) ? setTimeout(onTimeout, timeoutMs) : undefined;
}

/** The method did not answer in time (the caller names it and the silent ranks). */
export class RpcTimeout extends Error {
  override name = 'RpcTimeout';
}

/**
 * The method threw on the other side: `message` is the remote error's text, `detail` what it
 * attached as data (unchecked here: the caller checks it against what it expects).
 */
export class RemoteError extends Error {
  override name = 'RemoteError';
  constructor(
    message: string,
    readonly detail?: unknown,
  ) {
    super(message);
  }
}

/** Replaces every Float32Array in a value by {$tensor: i} and collects them. */
export function packValue(value: unknown, tensors: Float32Array[] = []): { packed: unknown; tensors: Float32Array[] } {
  const walk = (v: unknown): unknown => {
    if (v instanceof Float32Array) return { $tensor: tensors.push(v) - 1 };
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    return v;
  };
  return { packed: walk(value), tensors };
}

export function unpackValue(value: unknown, tensors: Float32Array[]): unknown {
  const walk = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(walk);
    if (v && typeof v === 'object') {
      const ref = (v as { $tensor?: unknown }).$tensor;
      if (typeof ref === 'number') {
        if (!Number.isInteger(ref) || !tensors[ref]) throw new Error(`reference to tensor ${ref} of ${tensors.length}`);
        return tensors[ref];
      }
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
    }
    return v;
  };
  return walk(value);
}

function parseBody(msg: Message): Body | null {
  if (msg.kind !== 'rpc') return null;
  const b = msg.body as Partial<Body> | null;
  if (!b || typeof b !== 'object' || !Number.isInteger(b.id)) return null;
  if (b.type === 'request' && typeof (b as { method?: unknown }).method === 'string') return b as Body;
  if (b.type === 'reply' && typeof (b as { ok?: unknown }).ok === 'boolean') return b as Body;
  return null;
}

/** Each method's name and contract. */
function methodsOf<Api>(contract: ApiContract<Api>): [string, MethodContract<unknown, unknown>][] {
  return Object.entries(contract as Record<string, MethodContract<unknown, unknown>>);
}

/** The method's contract, if `method` names one of the API's own methods (never an inherited property). */
function contractOf<Api>(contract: ApiContract<Api>, method: string): MethodContract<unknown, unknown> | null {
  return Object.hasOwn(contract, method)
    ? (contract as Record<string, MethodContract<unknown, unknown>>)[method]
    : null;
}

/** A reply that breaks the contract, as the error its caller sees: who sent it, to which call, what was wrong. */
function replyBreach(peer: string, method: string, e: unknown): ContractError {
  return new ContractError(`${peer} answered ${method} with a malformed reply: ${(e as Error).message}`);
}

/** The calling side over a link: replies matched to requests by id and checked against the contract. */
export function remote<Api>(
  link: Link,
  from: number,
  contract: ApiContract<Api>,
  peer: string,
): Remote<Api> & { failAll(reason: string): void } {
  let nextId = 1;
  const pending = new Map<
    number,
    { method: string; reply: Check<unknown>; resolve: (v: unknown) => void; reject: (e: Error) => void }
  >();
  // a reply that does not decode cannot be matched to its call: every call waiting fails as that
  // reply's would, a breach, rather than wait for its timeout
  link.onMalformed((reason) => {
    for (const waiting of pending.values())
      waiting.reject(
        new ContractError(`${peer} sent a message that does not decode while ${waiting.method} waited: ${reason}`),
      );
    pending.clear();
  });
  link.onMessage((msg) => {
    const body = parseBody(msg);
    if (body?.type !== 'reply' || msg.kind !== 'rpc') return;
    const call = pending.get(body.id);
    if (!call) return;
    pending.delete(body.id);
    if (!body.ok) {
      call.reject(new RemoteError(String(body.error), body.detail));
      return;
    }
    try {
      call.resolve(call.reply(unpackValue(body.result, msg.tensors), 'reply'));
    } catch (e) {
      call.reject(replyBreach(peer, call.method, e));
    }
  });
  const call = (method: string, reply: Check<unknown>, args: unknown, timeoutMs = DEFAULT_RPC_TIMEOUT_MS) => {
    const id = nextId++;
    return new Promise<unknown>((resolve, reject) => {
      const timer = deadline(timeoutMs, () => {
        pending.delete(id);
        reject(new RpcTimeout(`${method} did not answer within ${timeoutMs} ms`));
      });
      const settle =
        <A>(fn: (a: A) => void) =>
        (a: A) => {
          clearTimeout(timer);
          fn(a);
        };
      pending.set(id, { method, reply, resolve: settle(resolve), reject: settle(reject) });
      const { packed, tensors } = packValue(args);
      link
        .send({ kind: 'rpc', from, body: { type: 'request', id, method, args: packed }, tensors })
        .catch((e: unknown) => {
          pending.get(id)?.reject(new RemoteError(`could not send ${method} to ${peer}: ${(e as Error).message}`));
          pending.delete(id);
        });
    });
  };
  const api = Object.fromEntries(
    methodsOf(contract).map(([method, { reply }]) => [
      method,
      (args: unknown, timeoutMs?: number) => call(method, reply, args, timeoutMs),
    ]),
  );
  return Object.assign(api as Remote<Api>, {
    /** Rejects every call still waiting (the link closed). */
    failAll(reason: string) {
      for (const waiting of pending.values()) waiting.reject(new RemoteError(reason));
      pending.clear();
    },
  });
}

/** Runs one request against the implementation: unknown methods and arguments that break the contract are refused. */
async function answer<Api>(impl: Api, contract: ApiContract<Api>, method: string, args: unknown): Promise<unknown> {
  const methodContract = contractOf(contract, method);
  if (!methodContract)
    throw new Error(`unknown method "${method}"; this side answers only: ${Object.keys(contract).join(', ')}`);
  const checked = methodContract.args(args ?? {}, `${method} arguments`);
  return (impl as Record<string, (a: unknown) => Promise<unknown>>)[method](checked);
}

/** The answering side: every request is checked, run on `impl`, and its result or error goes back. */
export function serve<Api>(link: Link, from: number, contract: ApiContract<Api>, impl: Api): () => void {
  return link.onMessage((msg) => {
    const body = parseBody(msg);
    if (body?.type !== 'request' || msg.kind !== 'rpc') return;
    const reply = (b: Body, tensors: Float32Array[] = []) =>
      link.send({ kind: 'rpc', from, body: b, tensors }).catch(() => {});
    Promise.resolve()
      .then(() => answer(impl, contract, body.method, unpackValue(body.args, msg.tensors)))
      .then(
        (result) => {
          const { packed, tensors } = packValue(result);
          return reply({ type: 'reply', id: body.id, ok: true, result: packed }, tensors);
        },
        (e: unknown) => {
          const detail = (e as { detail?: unknown } | null)?.detail;
          return reply({
            type: 'reply',
            id: body.id,
            ok: false,
            error: e instanceof Error ? e.message : String(e),
            ...(detail === undefined ? {} : { detail }),
          });
        },
      );
  });
}

/**
 * The same calls without a link, for an implementation in this page: arguments and replies pass the
 * same checks, a thrown error arrives as a RemoteError with its detail, and a timeout as RpcTimeout.
 */
export function inProcess<Api>(impl: Api, contract: ApiContract<Api>, peer: string): Remote<Api> {
  const call = async (method: string, reply: Check<unknown>, args: unknown, timeoutMs = DEFAULT_RPC_TIMEOUT_MS) => {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<never>(
      (_, reject) =>
        (timer = deadline(timeoutMs, () => reject(new RpcTimeout(`${method} did not answer within ${timeoutMs} ms`)))),
    );
    try {
      const result = await Promise.race([
        answer(impl, contract, method, args).catch((e: unknown) => {
          throw new RemoteError(e instanceof Error ? e.message : String(e), (e as { detail?: unknown } | null)?.detail);
        }),
        timeout,
      ]);
      try {
        return reply(result, 'reply');
      } catch (e) {
        throw replyBreach(peer, method, e);
      }
    } finally {
      clearTimeout(timer);
    }
  };
  return Object.fromEntries(
    methodsOf(contract).map(([method, { reply }]) => [
      method,
      (args: unknown, timeoutMs?: number) => call(method, reply, args, timeoutMs),
    ]),
  ) as Remote<Api>;
}
