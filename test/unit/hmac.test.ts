import { createHmac, createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { hmacSha256, joinProof, sha256 } from '../../core/net/hmac.ts';
import { SeededRandom } from '../../core/random.ts';

const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');
const utf8 = (s: string) => new TextEncoder().encode(s);

// The join handshake's HMAC in plain TypeScript (LAN worker pages have no crypto.subtle), held to
// FIPS 180-4's and RFC 4231's published values and to Node's crypto on random inputs.
describe('SHA-256 and HMAC-SHA-256', () => {
  it('give the published test vectors', () => {
    expect(hex(sha256(utf8('abc')))).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(hex(sha256(new Uint8Array(0)))).toBe('e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855');
    expect(hex(hmacSha256(utf8('Jefe'), utf8('what do ya want for nothing?')))).toBe(
      '5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843',
    );
    // RFC 4231 case 6: a key longer than a block
    expect(
      hex(hmacSha256(new Uint8Array(131).fill(0xaa), utf8('Test Using Larger Than Block-Size Key - Hash Key First'))),
    ).toBe('60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54');
  });

  it("equal Node's crypto for inputs of every length around the block boundaries", () => {
    const random = new SeededRandom(9);
    for (const length of [1, 55, 56, 63, 64, 65, 119, 120, 128, 1000]) {
      const data = Uint8Array.from(random.normals(length), (v) => Math.abs(v * 1000) & 255);
      expect(hex(sha256(data))).toBe(createHash('sha256').update(data).digest('hex'));
      expect(hex(hmacSha256(data.subarray(0, 40), data))).toBe(
        createHmac('sha256', data.subarray(0, 40)).update(data).digest('hex'),
      );
    }
  });

  it('a join proof depends on the token, the side and everything it is bound to', () => {
    const proof = joinProof('token', 'coordinator', 'n1', 'n2', 'w', 'c');
    expect(proof).toMatch(/^[0-9a-f]{64}$/);
    for (const other of [
      joinProof('tokem', 'coordinator', 'n1', 'n2', 'w', 'c'),
      joinProof('token', 'worker', 'n1', 'n2', 'w', 'c'),
      joinProof('token', 'coordinator', 'n2', 'n1', 'w', 'c'),
      joinProof('token', 'coordinator', 'n1', 'n2', 'x', 'c'),
    ]) {
      expect(other).not.toBe(proof);
    }
  });
});
