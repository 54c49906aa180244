/**
 * A seeded, portable PRNG (mulberry32 + Box–Muller): the same seed gives the same numbers in
 * every browser and in Node, which is what makes runs on different backends comparable.
 */
export class SeededRandom {
  private state: number;
  private spare: number | null = null;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** uniform in [0, 1) */
  uniform(): number {
    let t = (this.state = (this.state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }

  /** standard normal */
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u = 1 - this.uniform(); // (0, 1]: log stays finite
    const v = this.uniform();
    const r = Math.sqrt(-2 * Math.log(u));
    this.spare = r * Math.sin(2 * Math.PI * v);
    return r * Math.cos(2 * Math.PI * v);
  }

  normals(count: number, std = 1): Float32Array {
    // a plain loop: Float32Array.from's callback is many times slower, and a checkpoint is 1e9 numbers
    const out = new Float32Array(count);
    for (let i = 0; i < count; i++) out[i] = this.normal() * std;
    return out;
  }
}
