import type { Link } from './link.ts';
import type { Message } from './protocol.ts';

/**
 * Request/reply over a Link. A request names a method and carries arguments in which any
 * Float32Array travels as binary (never as JSON numbers); a reply carries the result or the
 * remote error's text. Malformed bodies are ignored: a peer cannot crash the other side.
 */
type Body =
  | { type: 'request'; id: number; method: string; args: unknown }
  | { type: 'reply'; id: number; ok: true; result: unknown }
  | { type: 'reply'; id: number; ok: false; error: string };

/** The method did not answer in time (the caller names it and the silent ranks). */
export class RpcTimeout extends Error {
  override name = 'RpcTimeout';
}

/** The method threw on the other side; `message` is the remote error's text. */
export class RemoteError extends Error {
  override name = 'RemoteError';
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

/** The calling side: one per link, replies matched to requests by id. */
export class RpcClient {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();

  constructor(
    private readonly link: Link,
    private readonly from: number,
  ) {
    link.onMessage((msg) => {
      const body = parseBody(msg);
      if (body?.type !== 'reply') return;
      const call = this.pending.get(body.id);
      if (!call) return;
      this.pending.delete(body.id);
      if (body.ok) {
        try {
          call.resolve(unpackValue(body.result, msg.kind === 'rpc' ? msg.tensors : []));
        } catch (e) {
          call.reject(new RemoteError(`malformed reply: ${(e as Error).message}`));
        }
      } else call.reject(new RemoteError(String(body.error)));
    });
  }

  call<T = unknown>(method: string, args: unknown = {}, timeoutMs = 60_000): Promise<T> {
    const id = this.nextId++;
    return new Promise<T>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new RpcTimeout(`${method} did not answer within ${timeoutMs} ms`));
      }, timeoutMs);
      const settle = <A>(fn: (a: A) => void) => (a: A) => (clearTimeout(timer), fn(a));
      this.pending.set(id, { resolve: settle(resolve as (v: unknown) => void), reject: settle(reject) });
      const { packed, tensors } = packValue(args);
      this.link.send({ kind: 'rpc', from: this.from, body: { type: 'request', id, method, args: packed }, tensors }).catch((e: Error) => {
        this.pending.get(id)?.reject(new RemoteError(`could not send ${method}: ${e.message}`));
        this.pending.delete(id);
      });
    });
  }

  /** Rejects every call still waiting (the link closed). */
  failAll(reason: string): void {
    for (const call of this.pending.values()) call.reject(new RemoteError(reason));
    this.pending.clear();
  }
}

/** The answering side: every request goes to `dispatch`; its result or error goes back. */
export function serveRpc(link: Link, from: number, dispatch: (method: string, args: unknown) => Promise<unknown>): () => void {
  return link.onMessage((msg) => {
    const body = parseBody(msg);
    if (body?.type !== 'request' || msg.kind !== 'rpc') return;
    const reply = (b: Body, tensors: Float32Array[] = []) => link.send({ kind: 'rpc', from, body: b, tensors }).catch(() => {});
    Promise.resolve()
      .then(() => dispatch(body.method, unpackValue(body.args, msg.tensors)))
      .then(
        (result) => {
          const { packed, tensors } = packValue(result);
          return reply({ type: 'reply', id: body.id, ok: true, result: packed }, tensors);
        },
        (e: unknown) => reply({ type: 'reply', id: body.id, ok: false, error: e instanceof Error ? e.message : String(e) }),
      );
  });
}
