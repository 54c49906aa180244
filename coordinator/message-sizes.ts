// What crosses between the coordinator and a worker in one RPC message (core/worker-api.ts MAX_MESSAGE_FLOATS), sized
// by the largest share a plan gives: a rank's tokens follow its heads (planUlysses), so on an uneven split the ranks
// with a head more hold more than ⌈tokens/degree⌉ rows. Every placement's message sizes are reckoned here; each check
// names what does not fit and what to do.
import { hiddenStateFloats } from '../core/model/blocks.ts';
import type { WanConfig } from '../core/model/config.ts';
import { planUlysses } from '../core/parallel.ts';
import { formatBytes, MAX_MESSAGE_FLOATS } from '../core/worker-api.ts';

/** What sizing a message needs of a model. */
export type MessageModel = Pick<WanConfig, 'numHeads' | 'dim' | 'inChannels' | 'outChannels' | 'patchSize'>;

/** The tokens of a mesh's busiest rank: planUlysses' rows for `heads` ranks of even heads, or those head shares. */
export function largestRows(numHeads: number, tokens: number, heads: number | number[]): number {
  return Math.max(...planUlysses({ numHeads, headDim: 1 }, tokens, heads).rows);
}

/** One message of a placement: what it is, in words, its floats, and what to do where it does not fit. */
export interface Message {
  what: string;
  floats: number;
  remedy?: string;
}

/** A message over MAX_MESSAGE_FLOATS: which, how large, and what to do. */
export class MessageTooLarge extends Error {
  override name = 'MessageTooLarge';
  constructor(readonly sent: Message) {
    super(oversized(sent) ?? `${sent.what} fits one message`);
  }
}

/** Why `message` does not fit one message between the coordinator and a worker, or null where it does. */
export function oversized(message: Message): string | null {
  if (message.floats <= MAX_MESSAGE_FLOATS) return null;
  return (
    `${message.what} would be ${formatBytes(4 * message.floats)}, more than the ` +
    `${formatBytes(4 * MAX_MESSAGE_FLOATS)} one message carries${message.remedy ? `: ${message.remedy}` : ''}`
  );
}

/** Throws MessageTooLarge for the first of `messages` that does not fit one message. */
export function checkMessages(messages: readonly Message[]): void {
  const over = messages.find((m) => oversized(m) !== null);
  if (over) throw new MessageTooLarge(over);
}

/** A stage's job: its tokens, its text's, and its mesh's heads (a degree of even shares, or the shares). */
export interface MeshJob {
  tokens: number;
  textTokens: number;
  heads: number | number[];
}

/** Floats of the hidden state a stage's busiest rank hands the next stage: its tokens' rows and the conditioning. */
export const handedOnFloats = (model: MessageModel, job: MeshJob): number =>
  hiddenStateFloats(model.dim, largestRows(model.numHeads, job.tokens, job.heads), job.textTokens);

/**
 * The hidden state a rank hands the next pipeline stage goes to it directly (rank/hand-off.ts), of any size; a spot
 * check takes it from the receiver's receipts, in one message (handOffEvidence).
 */
export const handOffEvidence = (model: MessageModel, job: MeshJob): Message => ({
  what: "a rank's hand-off between pipeline stages, as a spot check takes it from its receiver",
  floats: handedOnFloats(model, job),
  remedy: 'ask spotCheckRate 0, or more workers a stage (ulyssesDegree), which share the tokens',
});

const patchVolume = (model: MessageModel): number => model.patchSize.reduce((a, b) => a * b, 1);

/** The patches the busiest rank of the first stage (or of a mesh holding every block) takes: [rows, C·pt·ph·pw]. */
export const patchesIn = (model: MessageModel, job: MeshJob): Message => ({
  what: "a rank's patches",
  floats: largestRows(model.numHeads, job.tokens, job.heads) * model.inChannels * patchVolume(model),
  remedy: 'run more workers (ulyssesDegree), which share the tokens, or a smaller video',
});

/** The rows the busiest rank of the last stage (or of a mesh holding every block) returns: [rows, pt·ph·pw·C]. */
export const rowsOut = (model: MessageModel, job: MeshJob): Message => ({
  what: "a rank's output rows",
  floats: largestRows(model.numHeads, job.tokens, job.heads) * model.outChannels * patchVolume(model),
  remedy: 'run more workers (ulyssesDegree), which share the tokens, or a smaller video',
});

/**
 * What a spot check of a staged forward sends in one message: the hidden state of every token a stage's
 * recomputation starts from (RecomputeArgs.hidden), and the last stage's rows of every token it returns.
 */
export const recomputeMessages = (model: MessageModel, job: Omit<MeshJob, 'heads'>): Message[] => [
  {
    what: "the hidden state of every token that a stage's recomputation starts from",
    floats: hiddenStateFloats(model.dim, job.tokens, job.textTokens),
  },
  {
    what: "the rows of every token that the last stage's recomputation returns",
    floats: job.tokens * model.outChannels * patchVolume(model),
  },
];

/** How many items of `floatsEach` one message carries: at least one (an item larger than a message goes alone). */
export const itemsPerMessage = (floatsEach: number): number => Math.max(1, Math.floor(MAX_MESSAGE_FLOATS / floatsEach));
