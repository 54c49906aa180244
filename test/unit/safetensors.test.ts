import { describe, expect, it } from 'vitest';
import { defined } from '../../core/defined.ts';
import { readSafetensors, writeSafetensors, SafetensorsError } from '../../core/safetensors.ts';

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
