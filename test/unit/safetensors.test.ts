import { describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { SeededRandom } from '../../core/random.ts';
import {
  readSafetensors,
  readSafetensorsHeader,
  readTensor,
  readTensorRun,
  tensorRuns,
  writeSafetensors,
  SafetensorsError,
  type ByteRanges,
  type TensorEntry,
} from '../../core/safetensors.ts';

function rawFile(header: object, data: Uint8Array): Uint8Array {
  const json = new TextEncoder().encode(JSON.stringify(header));
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

describe('safetensors', () => {
  it('round-trips float32 tensors with their shapes and metadata', () => {
    const a = { shape: [2, 3], data: Float32Array.from([1, -2, 3.5, 0, 1e-7, -1e7]) };
    const b = { shape: [1], data: Float32Array.of(42) };
    const bytes = writeSafetensors(
      new Map([
        ['b', b],
        ['a', a],
      ]),
      { made: 'test' },
    );
    const back = readSafetensors(bytes, 'x.safetensors');
    expect([...back.keys()].sort()).toEqual(['a', 'b']);
    expect(defined(back.get('a'), 'a').shape).toEqual([2, 3]);
    expect([...defined(back.get('a'), 'a').data]).toEqual([...a.data]);
    expect(defined(back.get('b'), 'b').data[0]).toBe(42);
  });

  it('widens F16 and BF16 exactly', () => {
    // F16: 1.0 = 0x3c00, -2.5 = 0xc100, smallest subnormal 0x0001; BF16: 1.0 = 0x3f80, -3.0 = 0xc040
    const f16 = new Uint16Array([0x3c00, 0xc100, 0x0001]);
    const bf16 = new Uint16Array([0x3f80, 0xc040]);
    const data = new Uint8Array([...new Uint8Array(f16.buffer), ...new Uint8Array(bf16.buffer)]);
    const file = rawFile(
      {
        h: { dtype: 'F16', shape: [3], data_offsets: [0, 6] },
        b: { dtype: 'BF16', shape: [2], data_offsets: [6, 10] },
      },
      data,
    );
    const t = readSafetensors(file, 'mixed.safetensors');
    expect([...defined(t.get('h'), 'h').data]).toEqual([1, -2.5, 2 ** -24]);
    expect([...defined(t.get('b'), 'b').data]).toEqual([1, -3]);
  });

  it('writes BF16 and F16 as the value of that type nearest each float32 (ties to even), which reads back', () => {
    // what "nearest" means, independent of the writer: every value of the type, decoded by the reader
    const everyValue = (dtype: 'BF16' | 'F16') => {
      const all = new Uint16Array(65536).map((_, i) => i);
      const decoded = readSafetensors(
        rawFile({ t: { dtype, shape: [65536], data_offsets: [0, 131072] } }, new Uint8Array(all.buffer)),
        'all',
      );
      return defined(decoded.get('t'), 't').data;
    };
    const random = new SeededRandom(11);
    const values = Float32Array.from([
      ...Array.from({ length: 400 }, () => random.normal() * 10 ** Math.floor(random.uniform() * 12 - 6)),
      1 + 2 ** -8, // halfway between two bfloat16s: to the even one
      1 + 3 * 2 ** -9,
      1 + 2 ** -11, // halfway between two float16s: to the even one
      1 + 3 * 2 ** -11,
      65504, // float16's largest
      65519, // rounds down to it
      65520, // past the midpoint: infinity
      2 ** -25, // float16's smallest subnormal is 2^-24: a tie, to even (zero)
      3 * 2 ** -25,
      2 ** -14 - 2 ** -26, // just under float16's smallest normal
      -0,
      3.4e38,
    ]);
    for (const dtype of ['BF16', 'F16'] as const) {
      const table = everyValue(dtype);
      const finite = [...table.keys()].filter((i) => Number.isFinite(table[i])).sort((a, b) => table[a] - table[b]);
      const back = defined(
        readSafetensors(
          writeSafetensors(new Map([['v', { shape: [values.length], data: values }]]), {}, dtype),
          'v',
        ).get('v'),
        'v',
      ).data;
      const largest = table[finite[finite.length - 1]];
      // the step past the largest finite value, as IEEE rounding has it: half an ulp beyond it overflows
      const ulp = dtype === 'F16' ? 32 : 2 ** 120;
      values.forEach((v, i) => {
        if (Math.abs(v) >= largest + ulp / 2) {
          expect(back[i]).toBe(v > 0 ? Infinity : -Infinity);
          return;
        }
        // the codes on either side of v, then the nearer (the even code on a tie)
        let [lo, hi] = [0, finite.length - 1];
        while (hi - lo > 1) {
          const mid = (lo + hi) >> 1;
          if (table[finite[mid]] <= v) lo = mid;
          else hi = mid;
        }
        const [a, b] = [finite[lo], finite[hi]];
        const [da, db] = [Math.abs(table[a] - v), Math.abs(table[b] - v)];
        const best = da < db || (da === db && (a & 1) === 0) ? a : b;
        expect(back[i] === table[best], `${dtype} of ${v}: ${back[i]}, nearest ${table[best]}`).toBe(true);
      });
    }
  });

  it('names the file and the tensor when a file is corrupt', () => {
    const ok = { dtype: 'F32', shape: [2], data_offsets: [0, 8] };
    const cases: [Uint8Array, RegExp][] = [
      [new Uint8Array(3), /bad\.st: only 3 bytes/],
      [rawFile({ w: ok }, new Uint8Array(8)).subarray(0, 20), /bad\.st: header claims/],
      [rawFile({ w: { ...ok, dtype: 'I64' } }, new Uint8Array(8)), /bad\.st: tensor "w" has dtype "I64"/],
      [
        rawFile({ w: { ...ok, shape: [3] } }, new Uint8Array(8)),
        /bad\.st: tensor "w" of shape \[3\] F32 needs 12 bytes but spans 8/,
      ],
      [
        rawFile({ w: { ...ok, data_offsets: [0, 16] } }, new Uint8Array(8)),
        /bad\.st: tensor "w" has data_offsets \[0,16\] outside the 8 data bytes/,
      ],
    ];
    for (const [bytes, message] of cases) {
      expect(() => readSafetensors(bytes, 'bad.st')).toThrow(SafetensorsError);
      expect(() => readSafetensors(bytes, 'bad.st')).toThrow(message);
    }
    const notJson = rawFile({}, new Uint8Array(0));
    notJson[8] = 0x7b + 1; // breaks the opening brace
    expect(() => readSafetensors(notJson, 'bad.st')).toThrow(/bad\.st: header is not valid JSON/);
  });
});

describe('safetensors from a Node Buffer', () => {
  it('reads float32 data from a pooled Buffer view, not from the whole pool', () => {
    const bytes = writeSafetensors(new Map([['w', { shape: [3], data: Float32Array.of(1, 2, 3) }]]));
    const pooled = Buffer.from(bytes); // small Buffers are views into Node's shared pool
    expect([...defined(readSafetensors(pooled, 'pooled.st').get('w'), 'w').data]).toEqual([1, 2, 3]);
  });
});

describe('a run of neighbouring tensors', () => {
  /** a file of `sizes` float32 tensors, t0 first, and its bytes as a server gives them, counting the requests */
  const fileOf = (sizes: number[], bytes?: (file: Uint8Array) => Uint8Array) => {
    const random = new SeededRandom(5);
    const tensors = new Map(sizes.map((n, i) => [`t${i}`, { shape: [n], data: random.normals(n) }]));
    const file = writeSafetensors(tensors);
    const served = bytes?.(file) ?? file;
    const requests: [number, number][] = [];
    const files: ByteRanges = {
      readRange: (_path, begin, end) => (requests.push([begin, end]), Promise.resolve(served.slice(begin, end))),
    };
    return { tensors, files, requests };
  };
  const entry = (name: string, begin: number, end: number, file = 'a'): TensorEntry => ({
    name,
    file,
    dtype: 'F32',
    shape: [(end - begin) / 4],
    begin,
    end,
  });

  it('is the tensors that lie end to end in one file, in its order, up to the bytes a read may ask for', () => {
    const names = (runs: TensorEntry[][]) => runs.map((run) => run.map((e) => e.name).join(''));
    const [a, b, c, d] = [entry('a', 0, 40), entry('b', 40, 80), entry('c', 80, 200), entry('d', 204, 208)];
    expect(names(tensorRuns([c, a, d, b], 1000))).toEqual(['abc', 'd']); // sorted; a gap ends a run
    expect(names(tensorRuns([a, b, c], 80))).toEqual(['ab', 'c']); // at most 80 bytes a run
    expect(names(tensorRuns([a, b, c], 79))).toEqual(['a', 'b', 'c']);
    expect(names(tensorRuns([entry('x', 0, 400), entry('y', 400, 440)], 100))).toEqual(['x', 'y']); // x alone
    expect(names(tensorRuns([a, entry('e', 40, 80, 'b')], 1000))).toEqual(['a', 'e']); // another file
  });

  it('reads each run with one request, each tensor the values readTensor reads, in a buffer of its own', async () => {
    const { tensors, files, requests } = fileOf([3, 5, 7, 2]);
    const entries = await readSafetensorsHeader(files, 'a');
    requests.length = 0;
    const runs = tensorRuns(entries);
    expect(runs).toHaveLength(1);
    const read = await readTensorRun(files, runs[0]);
    expect(requests).toHaveLength(1);
    runs[0].forEach((e, i) => {
      expect(read[i].shape).toEqual(e.shape);
      expect(read[i].data).toEqual(defined(tensors.get(e.name), e.name).data);
      expect(read[i].data.buffer.byteLength).toBe(read[i].data.byteLength);
    });
    const alone = await readTensorRun(files, [entries[1]]);
    expect(alone[0].data).toEqual((await readTensor(files, entries[1])).data);
  });

  it('read from a file cut short names the first tensor it lacks, as readTensor does', async () => {
    const { files } = fileOf([3, 5, 7], (file) => file.subarray(0, file.byteLength - 10));
    const entries = await readSafetensorsHeader(fileOf([3, 5, 7]).files, 'a');
    await expect(readTensorRun(files, tensorRuns(entries)[0])).rejects.toThrow(
      /^a: tensor "t2" needs bytes \[\d+, \d+\) but the file holds 18 of them: truncated\? fetch it again$/,
    );
  });
});
