// What a rank sends its peers, signed so that a receiver can prove it (issue 33): a rank that sends a
// peer tensors within the model's bounds but wrong ones spoils every rank's rows alike, and a spot
// check alone cannot say who did it. Each tensor travels with its sender's Ed25519 signature over
// where it belongs (job, step, pass, block, phase, head group, sender, receiver) and the SHA-256 of
// its payload; the receiver checks both before using it and keeps them. The dashboard, which made
// every rank's key pair and gave each rank its own secret key alone, can then tell from a receiver's
// receipts what each sender really sent, and no receiver can make a sender say what it did not.
// Plain TypeScript (noble): a worker page at a LAN address is not a secure context (no crypto.subtle).
import * as ed from '@noble/ed25519';
import { sha256, sha512 } from '@noble/hashes/sha2.js';
import { SIGNATURE_BYTES, type TensorTag } from './protocol.ts';

ed.hashes.sha512 = sha512;

const KEY_BYTES = 32;

/** One rank's key pair, as the dashboard makes it (hex, to travel in an RPC's JSON). */
export interface SigningKeys {
  secretKey: string;
  publicKey: string;
}

/** What a rank signs with and checks its peers by (initWorker): its own secret key, every mesh rank's public key. */
export interface MeshSigning {
  secretKey: string;
  /** by rank of the mesh */
  publicKeys: string[];
}

export function newSigningKeys(): SigningKeys {
  const { secretKey, publicKey } = ed.keygen();
  return { secretKey: toHex(secretKey), publicKey: toHex(publicKey) };
}

export const payloadDigest = (payload: Uint8Array): Uint8Array => sha256(payload);

/** The bytes a sender signs for one tensor: its place in the job, its sender and receiver, its payload's digest. */
function statement(tag: TensorTag, from: number, to: number, digest: Uint8Array): Uint8Array {
  const bytes = new Uint8Array(4 * 8 + digest.length);
  const view = new DataView(bytes.buffer);
  [tag.job, tag.step, tag.pass, tag.block, tag.phase, tag.group, from, to].forEach((v, i) =>
    view.setUint32(4 * i, v, true),
  );
  bytes.set(digest, 32);
  return bytes;
}

export function signPayload(secretKey: string, tag: TensorTag, from: number, to: number, digest: Uint8Array) {
  return ed.sign(statement(tag, from, to, digest), fromHex(secretKey, KEY_BYTES));
}

/** Whether `signature` is `publicKey`'s over this tensor; a malformed key or signature is not. */
export function verifyPayload(
  publicKey: string,
  tag: TensorTag,
  from: number,
  to: number,
  digest: Uint8Array,
  signature: Uint8Array,
): boolean {
  if (signature.length !== SIGNATURE_BYTES) return false;
  try {
    return ed.verify(signature, statement(tag, from, to, digest), fromHex(publicKey, KEY_BYTES));
  } catch {
    return false; // a key that is no point of the curve, from a page that made it up
  }
}

export const toHex = (bytes: Uint8Array): string => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

export function fromHex(hex: string, length: number): Uint8Array {
  if (hex.length !== 2 * length || !/^[0-9a-f]*$/.test(hex))
    throw new Error(`expected ${length} bytes as ${2 * length} lowercase hex digits`);
  return Uint8Array.from({ length }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16));
}
