// A hostile worker page: the real worker page of the join link, with every frame it hands to a data
// channel or to its relay socket passing through rules the test sets (window.__hostile). What the
// page then sends is what a peer that controls its own page can send: the frames of the wire
// protocol (core/net/protocol.ts), rewritten. Nothing in the product is changed; the page's own
// globals are (RTCDataChannel, RTCPeerConnection, WebSocket), before its scripts run.
import type { Page } from '@playwright/test';
import { HEADER_BYTES, PROTOCOL_VERSION, readHeader, SIGNATURE_BYTES } from '../../../core/net/protocol.ts';
import { payloadDigest, signPayload, verifyPayload } from '../../../core/net/signing.ts';

/** What a hostile worker page does to what it sends; unset parts are sent as the page made them. */
export interface HostileRules {
  /** its executeModel replies, from its `from`-th of the job (0-based) on; with `step`, those of that step only */
  rows?: {
    from: number;
    step?: number;
    /**
     * NaN values of the right length, `by` added to each of its values (a pipeline stage's before the last: to its
     * hidden state's tokens), or an error instead of the rows
     */
    make: 'nan' | 'shift' | 'error';
    by?: number;
    error?: string;
    /** blame sent with the error, as data: `rank` 'next' is the rank after this one in its mesh */
    blame?: { rank: number | 'next'; cause: string; evidence: string };
  };
  /** its recompute replies (a spot check it was picked to make): a value of the other ranks' rows moved by `by` */
  recompute?: { by: number };
  /** the tensors it sends the other ranks of its job in the forwards of step `step` (0-based) and later */
  mesh?: {
    step: number;
    /**
     * nan: the first value NaN; nudge: the lowest bit of its first payload byte flipped (a value, or an int8
     * scale, moved by one unit in its last place: within every bound, and no longer what it signed);
     * resign: each float32 attention output it sends (a single frame), halved and signed again with the
     * key its initWorker gave it (a liar holds its own key: within every bound, and signed as its own);
     * huge: each of its first chunk's values as large as a float32 goes and stays finite (3e38; int8
     * and int4: its first nonzero scale, so that the levels reach it);
     * withhold: none sent; flood: each one sent, and with the first of
     * step `step` `count` more for later steps (the ranks' all-to-all has never asked for them);
     * stale: each one sent, and with the first of step `step` a copy of it for two steps back
     * and a copy as float16 (the same bytes as twice as many values)
     */
    make: 'nan' | 'nudge' | 'resign' | 'huge' | 'withhold' | 'flood' | 'stale';
    count?: number;
  };
  /** replaces the pulse of each of its heartbeat answers */
  pulse?: unknown;
  /**
   * Before it is admitted: `bigChunks` first chunks of RPC messages that each declare 64 MiB, sent
   * as its link to the dashboard opens; `neverClose`: the page closes none of its data channels
   * (the other side has to); `coordinator`: the dashboard id it dials, known from elsewhere (a link
   * it held before it was revoked, say): the server, which names it to no page without the token,
   * is not asked.
   */
  join?: { bigChunks?: number; neverClose?: boolean; coordinator?: string };
}

/** What the hostile page did, and what it learnt from what it received. */
export interface HostileLog {
  rowsReplies: number;
  rowsTampered: number;
  recomputesTampered: number;
  tensorsPoisoned: number;
  tensorsWithheld: number;
  tensorsInjected: number;
  pulsesReplaced: number;
  /** its rank and world, from the last initWorker it was sent */
  rank: number | null;
  world: number | null;
  /** the data channels it dialed: when each opened and closed (ms since the epoch) */
  channels: { openedAt: number | null; closedAt: number | null }[];
  /** what went wrong applying the rules (a frame then went out as the page made it): hostileLog throws on any */
  failures: string[];
}

/**
 * Defines what a bundler's keep-names transform (tsx, esbuild) calls inside the functions Playwright
 * sends as source: without it the rules' code throws in the page, and the frames go out untampered.
 */
const KEEP_NAMES_SHIM = 'window.__name = window.__name || function (target) { return target; };';

/**
 * Installs the rules machinery in `page` (before its scripts run), starting with `rules`; a test
 * changes them later with setRules. Without rules the page behaves as the product made it.
 */
export async function makeHostile(page: Page, rules: HostileRules = {}): Promise<void> {
  await page.exposeFunction('__hostileResign', resign);
  await page.addInitScript({ content: KEEP_NAMES_SHIM });
  await page.addInitScript(hostileWire, { rules, version: PROTOCOL_VERSION });
}

export async function setRules(page: Page, rules: HostileRules): Promise<void> {
  await page.evaluate((r) => {
    if (typeof window.__hostileLog !== 'object') throw new Error('the hostile wire is not installed in this page');
    window.__hostile = r;
    Object.assign(window.__hostileLog, {
      rowsReplies: 0,
      rowsTampered: 0,
      recomputesTampered: 0,
      tensorsPoisoned: 0,
      tensorsWithheld: 0,
      tensorsInjected: 0,
      pulsesReplaced: 0,
    });
  }, rules);
}

/** What the hostile page did; an error where its wire is not installed or failed to apply its rules to a frame. */
export async function hostileLog(page: Page): Promise<HostileLog> {
  const log = await page.evaluate(() => (typeof window.__hostileLog === 'object' ? window.__hostileLog : null));
  if (!log) throw new Error('the hostile wire is not installed in this page: its rules were never applied');
  if (log.failures.length)
    throw new Error(`the hostile wire failed to apply its rules: ${log.failures.slice(0, 3).join('; ')}`);
  return log;
}

/** What the page asks of Node for its 'resign' rule: the frame of a float32 tensor it signed, and its keys. */
interface Resign {
  secretKey: string;
  publicKey: string;
  world: number;
  frame: number[];
}

/**
 * The frame with its values halved and signed again, for the receiver the page's own signature names
 * (the frame does not say which peer it goes to; its signature, made for one, does). In Node: the
 * page has no Ed25519 of its own to hand.
 */
function resign({ secretKey, publicKey, world, frame }: Resign): number[] {
  const bytes = Uint8Array.from(frame);
  const header = readHeader(bytes);
  if (typeof header === 'string' || !header.signed || header.dtype !== 'f32' || header.chunkCount !== 1)
    throw new Error(`resign takes one whole signed float32 tensor frame, not this: ${JSON.stringify(header)}`);
  const end = bytes.byteLength - SIGNATURE_BYTES;
  const rank = header.from;
  const signedFor = (to: number) =>
    verifyPayload(publicKey, header.tag, rank, to, payloadDigest(bytes.slice(HEADER_BYTES, end)), bytes.slice(end));
  const to = Array.from({ length: world }, (_, r) => r).find((r) => r !== rank && signedFor(r));
  if (to === undefined) throw new Error(`rank ${rank}'s own signature names none of its ${world - 1} peers`);
  const values = new Float32Array(bytes.slice(HEADER_BYTES, end).buffer).map((x) => x / 2);
  const data = new Uint8Array(values.buffer);
  bytes.set(data, HEADER_BYTES);
  bytes.set(signPayload(secretKey, header.tag, rank, to, payloadDigest(data)), end);
  return [...bytes];
}

/** Runs in the page, before its scripts: self-contained (Playwright sends it as source). */
function hostileWire({ rules: initial, version }: { rules: HostileRules; version: number }): void {
  const w = window;
  w.__hostile = initial;
  const log: HostileLog = (w.__hostileLog = {
    rowsReplies: 0,
    rowsTampered: 0,
    recomputesTampered: 0,
    tensorsPoisoned: 0,
    tensorsWithheld: 0,
    tensorsInjected: 0,
    pulsesReplaced: 0,
    rank: null,
    world: null,
    channels: [],
    failures: [],
  });
  const HEADER = 60;
  const RPC = 1;
  const TENSOR = 2;
  const PROBE_PHASE = 2;
  const COORDINATOR = 255;
  /** finite, and a rank computing with it overflows */
  const HUGE = 3e38;
  const LEVELS: Record<number, number> = { 2: 127, 3: 7 };
  const SCALE_GROUP = 64;
  const utf8 = new TextEncoder();
  const fromUtf8 = new TextDecoder();

  const bytesOf = (data: unknown): Uint8Array | null =>
    data instanceof ArrayBuffer
      ? new Uint8Array(data)
      : ArrayBuffer.isView(data)
        ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
        : null;
  const isFrame = (b: Uint8Array) => b.byteLength >= HEADER && b[0] === 0x44 && b[1] === 0x57 && b[2] === version;
  const view = (b: Uint8Array) => new DataView(b.buffer, b.byteOffset, b.byteLength);
  const headerOf = (b: Uint8Array) => {
    const v = view(b);
    return {
      kind: v.getUint8(3),
      dtype: v.getUint8(4),
      from: v.getUint8(5),
      chunkIndex: v.getUint32(12, true),
      chunkCount: v.getUint32(16, true),
      job: v.getUint32(28, true),
      step: v.getUint32(32, true),
      phase: v.getUint16(40, true),
      // the product of its shape's ndim dims
      elements: Array.from({ length: v.getUint8(6) }, (_, d) => v.getUint32(44 + 4 * d, true)).reduce(
        (n, x) => n * x,
        1,
      ),
    };
  };

  /** A single-frame RPC message's body and tensors (copies). */
  function decodeRpc(frame: Uint8Array): { body: RpcBody | null; tensors: Float32Array[] } | null {
    const h = headerOf(frame);
    if (h.kind !== RPC || h.chunkCount !== 1) return null;
    const p = frame.subarray(HEADER);
    const v = view(p);
    const jsonBytes = v.getUint32(0, true);
    const count = v.getUint32(4, true);
    const lengths = Array.from({ length: count }, (_, i) => v.getUint32(8 + 4 * i, true));
    const jsonStart = 8 + 4 * count;
    const parsed: unknown = JSON.parse(fromUtf8.decode(p.subarray(jsonStart, jsonStart + jsonBytes)));
    const body = typeof parsed === 'object' && parsed !== null ? (parsed as RpcBody) : null;
    let at = jsonStart + jsonBytes;
    at += (4 - (at % 4)) % 4;
    const tensors = lengths.map((n) => {
      const t = new Float32Array(p.slice(at, at + 4 * n).buffer);
      at += 4 * n;
      return t;
    });
    return { body, tensors };
  }

  /** One frame holding an RPC message, with `like`'s header (kind, from, msgId) and its own sizes. */
  function encodeRpc(like: Uint8Array, body: unknown, tensors: Float32Array[]): ArrayBuffer {
    const json = utf8.encode(JSON.stringify(body));
    const prefix = 8 + 4 * tensors.length;
    const pad = (4 - ((prefix + json.byteLength) % 4)) % 4;
    const total = prefix + json.byteLength + pad + tensors.reduce((n, t) => n + t.byteLength, 0);
    const out = new Uint8Array(HEADER + total);
    out.set(like.subarray(0, HEADER));
    const v = view(out);
    v.setUint32(12, 0, true); // chunkIndex
    v.setUint32(16, 1, true); // chunkCount
    v.setUint32(20, Math.max(total, v.getUint32(20, true)), true); // chunkStride: the whole payload in one chunk
    v.setUint32(24, total, true);
    v.setUint32(HEADER, json.byteLength, true);
    v.setUint32(HEADER + 4, tensors.length, true);
    tensors.forEach((t, i) => v.setUint32(HEADER + 8 + 4 * i, t.length, true));
    out.set(json, HEADER + prefix);
    let at = HEADER + prefix + json.byteLength + pad;
    for (const t of tensors) {
      out.set(new Uint8Array(t.buffer, t.byteOffset, t.byteLength), at);
      at += t.byteLength;
    }
    return out.buffer;
  }

  /** its own secret key and its mesh's public keys, from its last initWorker */
  let signing: { secretKey: string; publicKeys: string[] } | null = null;
  const OUTPUT_PHASE = 1;

  /** A single-frame float32 tensor, its values halved and signed again for its receiver (in Node: resign). */
  async function halvedAndSigned(frame: Uint8Array): Promise<ArrayBuffer[]> {
    const keys = signing;
    const { rank, world } = log;
    if (!keys || rank === null || world === null) throw new Error('a signed tensor before its initWorker');
    const { secretKey, publicKeys } = keys;
    const out = await w.__hostileResign({ secretKey, publicKey: publicKeys[rank], world, frame: [...frame] });
    log.tensorsPoisoned++;
    return [Uint8Array.from(out).buffer];
  }

  /** the method of each request its coordinator sent, by id: what a reply answers */
  const methods = new Map<number, string>();
  /** the step each request of a forward named, by id */
  const steps = new Map<number, number>();

  /** Learns the page's rank from the initWorker requests its coordinator sends it, and what each request asks. */
  function sniff(data: unknown): void {
    const b = bytesOf(data);
    const frame = b && (isFrame(b) ? b : b.byteLength > 4 && isFrame(b.subarray(4)) ? b.subarray(4) : null);
    if (!frame || headerOf(frame).from !== COORDINATOR) return;
    try {
      const body = decodeRpc(frame)?.body;
      if (body?.type !== 'request' || typeof body.id !== 'number' || typeof body.method !== 'string') return;
      methods.set(body.id, body.method);
      if (typeof body.args?.step === 'number') steps.set(body.id, body.args.step);
      if (body.method === 'initWorker') {
        const { rank, world, signing: keys } = body.args ?? {};
        log.rank = typeof rank === 'number' ? rank : null;
        log.world = typeof world === 'number' ? world : null;
        signing = keys ?? null;
      }
    } catch (e) {
      // not a message this page understands: the page's own code judges it; the wire's own code failing is a failure
      if (!(e instanceof SyntaxError)) log.failures.push(String(e));
    }
  }

  /** channels a flood or a stale copy was sent on already, by job */
  const injectedOn = new WeakMap<object, Set<number>>();
  let nextInjectedId = 0x40000000;

  /** What goes out instead of `frame` on `channel`: the frames to send (none: withheld). */
  function route(frame: Uint8Array, channel: object): ArrayBuffer[] | Promise<ArrayBuffer[]> {
    const rules = w.__hostile;
    const h = headerOf(frame);
    const copy = () => frame.slice().buffer;
    if (h.kind === TENSOR && rules.mesh && h.phase !== PROBE_PHASE && h.step >= rules.mesh.step) {
      const mesh = rules.mesh;
      if (mesh.make === 'withhold') {
        log.tensorsWithheld++;
        return [];
      }
      if (mesh.make === 'nan') {
        const out = frame.slice();
        if (h.chunkIndex === 0) {
          if (h.dtype === 0) view(out).setFloat32(HEADER, NaN, true);
          else view(out).setUint16(HEADER, 0x7e00, true);
          log.tensorsPoisoned++;
        }
        return [out.buffer];
      }
      if (mesh.make === 'nudge') {
        const out = frame.slice();
        if (h.chunkIndex === 0) {
          out[HEADER] ^= 1;
          log.tensorsPoisoned++;
        }
        return [out.buffer];
      }
      if (mesh.make === 'resign') {
        const signed = frame[7] === 1;
        if (h.phase !== OUTPUT_PHASE || h.dtype !== 0 || h.chunkCount !== 1 || !signed) return [copy()];
        return halvedAndSigned(frame);
      }
      if (mesh.make === 'huge') {
        if (h.chunkIndex !== 0) return [copy()];
        const out = frame.slice();
        const v = view(out);
        const end = out.byteLength - ((out.byteLength - HEADER) % 4);
        if (h.dtype === 0) for (let at = HEADER; at < end; at += 4) v.setFloat32(at, HUGE, true);
        else if (h.dtype === 1) for (let at = HEADER; at + 2 <= out.byteLength; at += 2) v.setUint16(at, 0x7bff, true);
        else {
          // a scale the quantizer could have written (its group's largest value is levels × it), all the same huge
          const scales = Math.min(Math.ceil(h.elements / SCALE_GROUP), (end - HEADER) / 4);
          let g = 0;
          while (g < scales && v.getFloat32(HEADER + 4 * g, true) === 0) g++;
          if (g === scales) throw new Error('a quantized tensor whose first chunk has no nonzero scale');
          v.setFloat32(HEADER + 4 * g, HUGE / LEVELS[h.dtype], true);
        }
        log.tensorsPoisoned++;
        return [out.buffer];
      }
      const done = injectedOn.get(channel) ?? new Set<number>();
      injectedOn.set(channel, done);
      if (h.chunkIndex !== 0 || h.chunkCount !== 1 || h.step !== mesh.step || done.has(h.job)) return [copy()];
      done.add(h.job);
      const variant = (edit: (v: DataView) => void) => {
        const out = frame.slice();
        const v = view(out);
        v.setUint32(8, nextInjectedId++, true); // a message id of its own: not a replay of the real one
        edit(v);
        log.tensorsInjected++;
        return out.buffer;
      };
      if (mesh.make === 'flood') {
        const floods = Array.from({ length: mesh.count ?? 1000 }, (_, i) =>
          variant((v) => v.setUint32(32, h.step + 1 + (i % (998 - h.step)), true)),
        );
        return [copy(), ...floods];
      }
      // stale: a forward two steps back, and the same bytes as float16 (twice the values)
      const past = variant((v) => v.setUint32(32, h.step - 2, true));
      const f16 = variant((v) => {
        v.setUint8(4, 1);
        v.setUint32(44, 2 * v.getUint32(44, true), true);
      });
      return [copy(), past, f16];
    }
    if (h.kind !== RPC || h.chunkCount !== 1 || (!rules.rows && !rules.recompute && rules.pulse === undefined))
      return [copy()];
    const rpc = decodeRpc(frame);
    const body = rpc?.body;
    if (!rpc || !body) return [copy()];
    if (body.type === 'heartbeat-echo' && rules.pulse !== undefined) {
      log.pulsesReplaced++;
      return [encodeRpc(frame, { ...body, pulse: rules.pulse }, rpc.tensors)];
    }
    const recomputed =
      body.type === 'reply' && body.ok === true && typeof body.id === 'number' && methods.get(body.id) === 'recompute'
        ? body.result?.rows?.$tensor
        : undefined;
    if (rules.recompute && typeof recomputed === 'number') {
      // the rows come in token order, rank 0's first: a value of another rank's, never its own
      const rows = rpc.tensors[recomputed];
      rows[log.rank === 0 ? rows.length - 1 : 0] += rules.recompute.by;
      log.recomputesTampered++;
      return [encodeRpc(frame, body, rpc.tensors)];
    }
    const rowsRef =
      body.type === 'reply' &&
      body.ok === true &&
      typeof body.id === 'number' &&
      methods.get(body.id) === 'executeModel'
        ? body.result?.rows?.$tensor
        : undefined;
    if (typeof rowsRef !== 'number') return [copy()];
    const index = log.rowsReplies++;
    if (!rules.rows || index < rules.rows.from) return [copy()];
    if (rules.rows.step !== undefined && typeof body.id === 'number' && steps.get(body.id) !== rules.rows.step)
      return [copy()];
    log.rowsTampered++;
    const { make } = rules.rows;
    if (make === 'nan' || make === 'shift') {
      // a pipeline stage before the last hands its tokens on as a hidden state, its rows empty: those it rewrites
      const handedOn = body.result?.hidden?.x?.$tensor;
      const rows =
        rpc.tensors[rowsRef].length === 0 && typeof handedOn === 'number'
          ? rpc.tensors[handedOn]
          : rpc.tensors[rowsRef];
      const by = rules.rows.by ?? 1;
      if (make === 'nan') rows.fill(NaN);
      else for (let i = 0; i < rows.length; i++) rows[i] += by;
      return [encodeRpc(frame, body, rpc.tensors)];
    }
    const blame = rules.rows.blame;
    const detail = blame && {
      ...blame,
      rank: blame.rank === 'next' ? ((log.rank ?? 0) + 1) % (log.world ?? 1) : blame.rank,
    };
    return [
      encodeRpc(
        frame,
        { type: 'reply', id: body.id, ok: false, error: rules.rows.error ?? 'failed', ...(detail ? { detail } : {}) },
        [],
      ),
    ];
  }

  const sendOn = (channel: object, data: unknown, send: (out: unknown) => void, envelope: Uint8Array | null) => {
    const b = bytesOf(data);
    const frame = b && (envelope ? b.subarray(4) : b);
    if (!frame || !isFrame(frame)) {
      send(data);
      return;
    }
    const wrap = (out: ArrayBuffer) => {
      if (!envelope) return out;
      const e = new Uint8Array(4 + out.byteLength);
      e.set(envelope);
      e.set(new Uint8Array(out), 4);
      return e.buffer;
    };
    let routed: ArrayBuffer[] | Promise<ArrayBuffer[]>;
    try {
      routed = route(frame, channel);
    } catch (e) {
      log.failures.push(String(e));
      routed = [frame.slice().buffer];
    }
    // signed again elsewhere: it goes out when that is done (a mesh's tensors may arrive in any order)
    const later = routed instanceof Promise ? routed : null;
    later?.then(
      (outs) =>
        outs.forEach((out) => {
          try {
            send(wrap(out));
          } catch {
            // the channel closed meanwhile
          }
        }),
      (e: unknown) => log.failures.push(String(e)),
    );
    (later ? [] : (routed as ArrayBuffer[])).forEach((out, i) => {
      if (i === 0) {
        send(wrap(out));
        return;
      }
      try {
        send(wrap(out)); // injected: the channel may have been closed by the peer meanwhile
      } catch {
        // a closed channel: the rest go nowhere either
      }
    });
  };

  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its channel below
  const dcSend = RTCDataChannel.prototype.send as (this: RTCDataChannel, data: ArrayBuffer) => void;
  RTCDataChannel.prototype.send = function (this: RTCDataChannel, data: unknown) {
    sendOn(this, data, (out) => dcSend.call(this, out as ArrayBuffer), null);
  };
  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its socket below
  const wsSend = WebSocket.prototype.send as (this: WebSocket, data: unknown) => void;
  WebSocket.prototype.send = function (this: WebSocket, data: unknown) {
    const b = typeof data === 'string' ? null : bytesOf(data);
    if (!b || b.byteLength < 4 + HEADER || !isFrame(b.subarray(4))) {
      wsSend.call(this, data);
      return;
    }
    sendOn(this, data, (out) => wsSend.call(this, out as ArrayBuffer), b.slice(0, 4));
  };

  // what it is sent, read before the page's own listeners: the same listener removes as it was added
  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on their targets below
  const { addEventListener: listen, removeEventListener: unlisten } = EventTarget.prototype;
  const sniffing = new WeakMap<EventListenerOrEventListenerObject, EventListener>();
  const sniffer = (inner: EventListenerOrEventListenerObject): EventListener => {
    let wrapped = sniffing.get(inner);
    if (!wrapped) {
      wrapped = function (this: unknown, event: Event) {
        sniff((event as MessageEvent).data);
        if (typeof inner === 'function') inner.call(this, event);
        else inner.handleEvent(event);
      };
      sniffing.set(inner, wrapped);
    }
    return wrapped;
  };
  const sniffed = (
    target: EventTarget,
    type: string,
    listener: EventListenerOrEventListenerObject | null,
  ): listener is EventListenerOrEventListenerObject =>
    type === 'message' && !!listener && (target instanceof RTCDataChannel || target instanceof WebSocket);
  type Listening = [type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | object];
  EventTarget.prototype.addEventListener = function (this: EventTarget, ...[type, listener, options]: Listening) {
    listen.call(this, type, sniffed(this, type, listener) ? sniffer(listener) : listener, options);
  };
  EventTarget.prototype.removeEventListener = function (this: EventTarget, ...[type, listener, options]: Listening) {
    unlisten.call(this, type, sniffed(this, type, listener) ? sniffer(listener) : listener, options);
  };

  // the channels it dials: when they open, what it sends before it is admitted, and when the other side closes them
  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on its connection below
  const createDataChannel = RTCPeerConnection.prototype.createDataChannel;
  RTCPeerConnection.prototype.createDataChannel = function (
    this: RTCPeerConnection,
    ...args: Parameters<RTCPeerConnection['createDataChannel']>
  ) {
    const channel = createDataChannel.apply(this, args);
    const seen = { openedAt: null as number | null, closedAt: null as number | null };
    log.channels.push(seen);
    listen.call(channel, 'open', () => {
      seen.openedAt = Date.now();
      const chunks = w.__hostile.join?.bigChunks ?? 0;
      const stride = 64 * 1024 - HEADER;
      const declared = 64 * 1024 * 1024;
      for (let i = 0; i < chunks; i++) {
        const frame = new Uint8Array(64 * 1024);
        const v = view(frame);
        v.setUint16(0, 0x5744, true);
        v.setUint8(2, version);
        v.setUint8(3, RPC);
        v.setUint8(5, 0);
        v.setUint32(8, 0x70000000 + i, true);
        v.setUint32(16, Math.ceil(declared / stride), true);
        v.setUint32(20, stride, true);
        v.setUint32(24, declared, true);
        dcSend.call(channel, frame.buffer);
      }
    });
    listen.call(channel, 'close', () => (seen.closedAt = Date.now()));
    return channel;
  };
  // eslint-disable-next-line @typescript-eslint/unbound-method -- called on the window below
  const fetchOriginal = window.fetch;
  window.fetch = function (input: RequestInfo | URL, init?: RequestInit) {
    const coordinator = w.__hostile.join?.coordinator;
    const url = new URL(input instanceof Request ? input.url : String(input), location.href);
    if (coordinator && url.pathname === '/swarms/find')
      return Promise.resolve(
        new Response(JSON.stringify({ coordinator }), { headers: { 'content-type': 'application/json' } }),
      );
    return fetchOriginal.call(window, input, init);
  };
  if (initial.join?.neverClose) {
    RTCDataChannel.prototype.close = function () {};
    RTCPeerConnection.prototype.close = function () {};
  }
}

/** What the hostile page reads of an RPC message's JSON body: any of it may be missing, it is a peer's. */
interface RpcBody {
  type?: unknown;
  id?: unknown;
  method?: unknown;
  ok?: unknown;
  args?: { rank?: unknown; world?: unknown; step?: unknown; signing?: { secretKey: string; publicKeys: string[] } };
  result?: { rows?: { $tensor?: unknown }; hidden?: { x?: { $tensor?: unknown } } };
}

declare global {
  interface Window {
    /** makeHostile: the rules the page's frames pass through, and what it did */
    __hostile: HostileRules;
    __hostileLog: HostileLog;
    /** makeHostile: a rewritten tensor signed again, in Node */
    __hostileResign(resign: Resign): Promise<number[]>;
  }
}
