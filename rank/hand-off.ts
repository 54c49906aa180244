// A pipeline stage's hidden state, handed straight to the rank of the next stage that computes the same tokens
// (core/parallel.ts: every stage of a group shares its head shares, so rank i of stage s hands to rank i of s + 1),
// never through the coordinator. It travels as one run of floats — temb, tproj, context, then x token by token —
// cut into tensors of at most HAND_OFF_CHUNK_FLOATS, so a hand-off has no size limit, only each message has; each
// tensor is signed by its sender where the pair signs (exchange/ledger.ts) and judged by its receiver before use.
import { hiddenStateError, hiddenStateFloats, type HiddenState } from '../core/model/blocks.ts';
import { payloadBytes, SIGNATURE_BYTES, tensorPayload, type DType } from '../core/net/protocol.ts';
import { fromHex, payloadDigest, toHex, verifyPayload } from '../core/net/signing.ts';
import { PeerLost, type ForwardKey, type HandOffEvidence } from '../core/worker-api.ts';
import type { ExchangeLedger } from './exchange/ledger.ts';
import { exchangePhase, ExchangePhase, type ExchangeTag, type PointToPoint } from './ulysses.ts';

/** the most floats one tensor of a hand-off carries: 8 MB in float32, well within a link's message cap */
export const HAND_OFF_CHUNK_FLOATS = 2 << 20;
/** a hand-off's tensors are numbered within a PipeFusion patch's by the low byte of the tag's group */
const CHUNKS_PER_PATCH = 256;
/** the hand-off's sender and receiver in their pair (RankMesh of two: core/worker-api.ts StageLinks) */
export const SENDER = 0;
export const RECEIVER = 1;

/** which of a rank's meshes a link is of: its stage's, or a hand-off pair with the stage before or after */
export type MeshKind = 'mesh' | 'before' | 'after';

/** A hand-off travels in float32 where the job's activations do (exact), else in float16 (never quantized further). */
export const handOffDType = (meshDType: DType): DType => (meshDType === 'f32' ? 'f32' : 'f16');

/** What a hand-off is of: a forward of the job, the block the receiver starts at, and PipeFusion's patch if any. */
export interface HandOffOf {
  tag: Omit<ExchangeTag, 'block' | 'phase' | 'group'>;
  /** the first block of the receiving stage */
  block: number;
  patch?: number;
}

/** The sizes of a hand-off's tensors, in order: even chunks, as few as a patch's numbering allows. */
export function handOffChunks(floats: number): number[] {
  const size = Math.max(HAND_OFF_CHUNK_FLOATS, Math.ceil(floats / CHUNKS_PER_PATCH));
  const count = Math.max(1, Math.ceil(floats / size));
  return Array.from({ length: count }, (_, i) => Math.min(size, floats - i * size));
}

const chunkTag = (of: HandOffOf, chunk: number): ExchangeTag => ({
  ...of.tag,
  block: of.block,
  phase: ExchangePhase.HandOff,
  group: (of.patch ?? 0) * CHUNKS_PER_PATCH + chunk,
});

/** Which tensor of a hand-off a tag names (its patch, and its chunk in the patch), for a receiver's judge. */
export const chunkOf = (group: number): { patch: number; chunk: number } => ({
  patch: Math.floor(group / CHUNKS_PER_PATCH),
  chunk: group % CHUNKS_PER_PATCH,
});

/** A hidden state as the one run of floats it travels as: temb, tproj, context, x. */
function runOf({ temb, tproj, context, x }: HiddenState): Float32Array {
  const run = new Float32Array(temb.length + tproj.length + context.length + x.length);
  let at = 0;
  for (const part of [temb, tproj, context, x]) {
    run.set(part, at);
    at += part.length;
  }
  return run;
}

/** A run cut into its hand-off's tensors, in order. */
function chunksOf(run: Float32Array): Float32Array[] {
  let start = 0;
  return handOffChunks(run.length).map((size) => run.subarray(start, (start += size)));
}

/**
 * Sends `hidden` to the next stage's rank: its payload bytes, at once. The tensors go on over the link while this rank
 * computes its next forward; a send that fails fails the link, which its receiver names (silent or disconnected) and
 * this rank's next hand-off on it throws.
 */
export function handOn(link: PointToPoint, of: HandOffOf, hidden: HiddenState): number {
  const before = link.bytesSent;
  const sends = chunksOf(runOf(hidden)).map((part, chunk) => link.send(chunkTag(of, chunk), RECEIVER, part));
  void Promise.all(sends).catch(() => {});
  return link.bytesSent - before;
}

/**
 * Why `evidence` is not what its sender signed for the hand-off `of` (each tensor's digest and the sender's signature
 * over it, in order), or null where it is: then the hidden state is the sender's word, which a spot check holds it to.
 */
export function unprovenHandOff(
  evidence: HandOffEvidence,
  of: HandOffOf,
  senderPublicKey: string,
  dtype: DType,
): string | null {
  const chunks = chunksOf(runOf(evidence.hidden));
  for (const [i, chunk] of chunks.entries()) {
    const tag = chunkTag(of, i);
    const where = `tensor ${i} of its hand-off`;
    // receipts are kept as tensors arrive: found by the tensor they are of, the last where a forward ran again
    const receipt = evidence.receipts.filter((r) => r.group === tag.group).at(-1);
    if (!receipt || receipt.from !== SENDER || receipt.block !== tag.block)
      return `its receipt of ${where} is missing or of another tensor`;
    const digest = payloadDigest(tensorPayload(chunk, dtype));
    if (toHex(digest) !== receipt.digest) return `the values it gave for ${where} are not those it kept a receipt of`;
    const signature = fromHex(receipt.signature, SIGNATURE_BYTES);
    if (!verifyPayload(senderPublicKey, tag, SENDER, RECEIVER, digest, signature))
      return `its receipt of ${where} is not signed by its sender`;
  }
  return null;
}

/**
 * The hidden state of `rows` tokens the stage before handed this rank: every tensor of it, then the whole judged (its
 * size, every value finite) before anything is computed from it; a malformed one is its sender's lie. `ms` is from the
 * first tensor's arrival to the last's: what the link took, apart from the sender's compute.
 */
export async function takeHandOff(
  link: PointToPoint,
  of: HandOffOf,
  shape: { dim: number; rows: number; textRows: number },
): Promise<{ hidden: HiddenState; bytes: number; ms: number }> {
  const { dim, rows, textRows } = shape;
  const run = new Float32Array(hiddenStateFloats(dim, rows, textRows));
  let first = Infinity;
  let last = 0;
  let start = 0;
  const receives = handOffChunks(run.length).map((size, chunk) => {
    const at = start;
    start += size;
    return link.receive(chunkTag(of, chunk), SENDER).then((part) => {
      const now = performance.now();
      first = Math.min(first, now);
      last = Math.max(last, now);
      if (part.length !== size) throw new HandOffRefused(`tensor ${chunk} of its hand-off has ${part.length} values`);
      run.set(part, at);
    });
  });
  await Promise.all(receives);
  const hidden: HiddenState = {
    temb: run.subarray(0, dim),
    tproj: run.subarray(dim, 7 * dim),
    context: run.subarray(7 * dim, (7 + textRows) * dim),
    x: run.subarray((7 + textRows) * dim),
  };
  const wrong = hiddenStateError({ dim }, hidden, rows, textRows);
  if (wrong) throw new HandOffRefused(`handed on a malformed hidden state: ${wrong}`);
  return { hidden, bytes: payloadBytes(run.length, link.dtype), ms: last - first };
}

/** What the stage before handed this rank is not a hidden state of its tokens: its sender's doing. */
export class HandOffRefused extends Error {
  override name = 'HandOffRefused';
}

/** PipeFusion's patches of one pass a stage may hand on before the next asks: more than any placement cuts */
export const MAX_PATCH_HAND_OFFS = 64;
/** the forwards whose received hand-offs a rank keeps for a spot check: a guided step's two passes */
const FORWARDS_KEPT = 2;

/**
 * Runs `send` or `take` on a hand-off link, its failures made the coordinator's to read: a partner gone, silent or
 * lying is blamed as the rank of the stage before or after at this rank's place in its mesh (RankLost.stage).
 */
export async function partnerBlamed<T>(which: 'before' | 'after', place: number, work: () => Promise<T>): Promise<T> {
  try {
    return await work();
  } catch (e) {
    if (e instanceof PeerLost) throw new PeerLost({ ...e.detail, rank: place, stage: which });
    if (e instanceof HandOffRefused)
      throw new PeerLost({ rank: place, cause: 'misbehaved', evidence: e.message, stage: which });
    throw e;
  }
}

/** The hand-offs a rank received in its last forwards, with their sender's signed receipts: a spot check's evidence. */
export class ReceivedHandOffs {
  private receipts: ExchangeLedger | null = null;
  private readonly kept = new Map<string, Map<number, HiddenState>>();

  /** The ledger the link keeps this rank's receipts in. */
  ledger(ledger: ExchangeLedger): ExchangeLedger {
    return (this.receipts = ledger);
  }

  keep(of: HandOffOf, hidden: HiddenState): void {
    const key = forwardKey(of.tag);
    const patches = this.kept.get(key) ?? new Map<number, HiddenState>();
    patches.set(of.patch ?? 0, hidden);
    this.kept.delete(key); // the newest last
    this.kept.set(key, patches);
    for (const old of this.kept.keys()) if (this.kept.size > FORWARDS_KEPT) this.kept.delete(old);
  }

  evidence(forward: ForwardKey, patch = 0): HandOffEvidence {
    const hidden = this.kept.get(forwardKey(forward))?.get(patch);
    if (!hidden)
      throw new Error(
        `no hand-off of job ${forward.job} step ${forward.step + 1} pass ${forward.pass}` +
          `${patch ? ` patch ${patch}` : ''} is kept here: only the last ${FORWARDS_KEPT} forwards'`,
      );
    const receipts = (this.receipts?.receipts(forward) ?? []).filter(
      (r) => exchangePhase(r.phase) === ExchangePhase.HandOff && chunkOf(r.group).patch === patch,
    );
    return { hidden, receipts };
  }

  clear(): void {
    this.kept.clear();
  }
}

const forwardKey = ({ job, step, pass }: ForwardKey) => `${job}/${step}/${pass}`;
