import { describe, expect, it } from 'vitest';
import {
  cleanPrompt,
  makeTestTokenizerJson,
  Umt5Tokenizer,
  UnsupportedTokenizer,
} from '../../core/model/umt5-tokenizer.ts';

// Vocabulary: <pad> 0, </s> 1, <unk> 2, the pieces below 3..10 (log-probs -1 .. -1.875), then
// ▁ 11 and the printable ASCII characters '!' 12 .. '~' 105 (log-probs below -10). A piece
// always beats characters, and fewer pieces beat more, so each segmentation below is the only best one.
const PIECES = ['▁a', '▁red', '▁ball', '▁the', '▁cat', '▁roll', 'ing', '▁caf'];
const tokenizer = new Umt5Tokenizer(makeTestTokenizerJson(PIECES));

describe('cleanPrompt (diffusers prompt_clean)', () => {
  it.each([
    ['  a\tred\n\nball  ', 'a red ball'],
    ['\u3000a\u00a0\x1cb\x85', 'a b'], // Python's whitespace, not JS's \s ...
    ['\ufeffa', '\ufeffa'], // ... which would also strip the BOM
    ['red &amp; ball', 'red & ball'],
    ['&amp;amp;', '&'], // unescaped twice ...
    ['&amp;amp;amp;', '&amp;'], // ... and only twice (ftfy, not ported, would go on)
    ['&amp;lt;b&amp;gt;', '<b>'],
    ['&quot;x&quot; &#39;y&#39; &apos;z&apos;', "\"x\" 'y' 'z'"],
    ['a&nbsp;b', 'a b'], // U+00A0, then collapsed as whitespace
    ['&#233;&#xE9;&#XE9;', 'ééé'],
    ['&#39 &amp &ampx &AMP;', "' & &x &"], // legacy forms without ';'
    ['&apos &#; &#x;', '&apos &#; &#x;'], // &apos has no legacy form; the others are not references
    ['&#0;&#xD800;&#x110000;', '\ufffd\ufffd\ufffd'],
    ['&#150;&#128;&#x81;', '\u2013\u20ac\x81'], // windows-1252, as browsers read them
    ['a&#1;b&#x7f;c&#xFFFF;d', 'abcd'], // invalid code points are dropped
    // the edges of each of html.unescape's ranges, as Python gives them
    ['a&#x80;&#x9F;&#xA1;b', 'a\u20ac\u0178\u00a1b'], // windows-1252 from 0x80 to 0x9f only
    ['a&#xD7FF;&#xE000;&#x10FFFD;b', 'a\ud7ff\ue000\u{10fffd}b'],
    ['a&#xDFFF;&#xD800;b', 'a\ufffd\ufffdb'], // surrogates
    ['a&#8;&#xB;&#xE;&#x1F;&#xFDD0;&#xFDEF;&#x1FFFE;&#x10FFFF;&#xFFFE;b', 'ab'],
    ['a&#9;b&#xC;c&#x20;d&#xD;e', 'a b c d e'], // tab, form feed, space and CR are kept, then collapsed
    ['&#xFDCF;&#xFDF0;&#xFFFD;&#x7E;', '\ufdcf\ufdf0\ufffd~'],
    ['&LTx &GT; &quotx &QUOT &gtx &AMPx &lt', '<x > "x " >x &x <'],
    ['&#x41x; &#65x', 'Ax; Ax'], // parseInt stops at the first non-digit
    ['&a b', '&a b'],
  ])('%j → %j', (prompt, cleaned) => {
    expect(cleanPrompt(prompt)).toBe(cleaned);
  });
});

describe('Umt5Tokenizer.encode', () => {
  it.each<[string, string, number[]]>([
    ['a red ball', '▁a ▁red ▁ball </s>', [3, 4, 5, 1]],
    ['the cat rolling', '▁the ▁cat ▁roll ing </s>', [6, 7, 8, 9, 1]],
    ['a dog', '▁a ▁ d o g </s>', [3, 11, 79, 90, 82, 1]],
    ['café', '▁caf é=<unk> </s>', [10, 2, 1]],
    ['cafe\u0301', 'NFKC composes e + U+0301 into é: ▁caf <unk> </s>', [10, 2, 1]],
    ['a 🐱', '▁a ▁ 🐱=<unk> </s>', [3, 11, 2, 1]],
    ['🐱🐶 cat', '▁ 🐱🐶=one <unk> (unknown neighbours fuse) ▁cat </s>', [11, 2, 7, 1]],
    ['  a\tred\n\nball  ', 'cleaned to "a red ball"', [3, 4, 5, 1]],
    ['red &amp;amp; ball', 'cleaned to "red & ball": ▁red ▁ & ▁ball </s>', [4, 11, 17, 5, 1]],
    ['the cat&#39;s ball', "▁the ▁cat ' s ▁ball </s>", [6, 7, 18, 94, 5, 1]],
    ['', '</s>', [1]],
    [' \t\n', 'cleaned to "": </s>', [1]],
  ])('%j → %s', (prompt, _segmentation, ids) => {
    expect(tokenizer.encode(prompt, 512)).toEqual({ ids, truncated: false, tokens: ids.length });
  });

  it('truncates like transformers: the first maxLength-1 tokens, then </s>', () => {
    expect(tokenizer.encode('a red ball a red ball', 5)).toEqual({ ids: [3, 4, 5, 3, 1], truncated: true, tokens: 7 });
    expect(tokenizer.encode('a red ball', 4)).toEqual({ ids: [3, 4, 5, 1], truncated: false, tokens: 4 });
    expect(tokenizer.encode('a red ball', 1)).toEqual({ ids: [1], truncated: true, tokens: 4 });
    expect(() => tokenizer.encode('a', 0)).toThrow(/maxLength must be an integer of at least 1/);
  });

  it("at the pipeline's 512: 511 content tokens fit with </s>; 512 or 513 keep the first 511 and end with </s>", () => {
    const reds = (n: number) => Array(n).fill('red').join(' ');
    expect(tokenizer.encode(reds(511), 512)).toEqual({
      ids: [...Array<number>(511).fill(4), 1],
      truncated: false,
      tokens: 512,
    });
    for (const n of [512, 513])
      expect(tokenizer.encode(reds(n), 512), `${n} content tokens`).toEqual({
        ids: [...Array<number>(511).fill(4), 1],
        truncated: true,
        tokens: n + 1,
      });
  });

  it('segments each word apart (Metaspace split: true): no piece spans a space', () => {
    const spanning = new Umt5Tokenizer(makeTestTokenizerJson(['▁red▁ball', '▁red', '▁ball']));
    expect(spanning.encode('red ball', 512).ids).toEqual([4, 5, 1]); // not [3 (▁red▁ball), 1]
  });

  it('refuses a tokenizer.json that is not T5 Unigram, saying what it is', () => {
    const t5 = makeTestTokenizerJson(PIECES) as Record<string, unknown>;
    const bpe = { ...t5, model: { type: 'BPE', vocab: {}, merges: [] } };
    expect(() => new Umt5Tokenizer(bpe)).toThrow(UnsupportedTokenizer);
    expect(() => new Umt5Tokenizer(bpe)).toThrow(
      'tokenizer/tokenizer.json is a BPE tokenizer; a T5 (Unigram) one was expected',
    );
    expect(() => new Umt5Tokenizer({ ...t5, post_processor: null })).toThrow(
      /post_processor .*"\$A <\/s>".* must be a JSON object; it is null/,
    );
    const bert = { type: 'BertProcessing', sep: ['[SEP]', 102], cls: ['[CLS]', 101] };
    expect(() => new Umt5Tokenizer({ ...t5, post_processor: bert })).toThrow(
      /post_processor must be T5's TemplateProcessing .*; it is "BertProcessing"/,
    );
    expect(() => new Umt5Tokenizer([])).toThrow('tokenizer/tokenizer.json must be a JSON object; it is an array');
    expect(() => new Umt5Tokenizer('{}')).toThrow('tokenizer/tokenizer.json must be a JSON object; it is string');
    expect(() => new Umt5Tokenizer({ ...t5, model: null })).toThrow(
      'tokenizer/tokenizer.json: model must be a JSON object; it is null',
    );
    expect(() => new Umt5Tokenizer(t5, [])).toThrow(
      'tokenizer/tokenizer_config.json must be a JSON object; it is an array',
    );
    const refusal = (json: unknown) => {
      try {
        new Umt5Tokenizer(json);
      } catch (e) {
        return e as Error;
      }
      throw new Error('accepted');
    };
    expect(refusal(bpe).name).toBe('UnsupportedTokenizer');
  });

  it("refuses a post_processor that is not T5's $A </s>, or whose special tokens have no ids", () => {
    const t5 = makeTestTokenizerJson(PIECES);
    const t5Template = t5.post_processor as Record<string, unknown>;
    const expected = 'post_processor must be T5\'s TemplateProcessing with single "$A </s>"';
    // the right template under another processor's name
    expect(() => new Umt5Tokenizer({ ...t5, post_processor: { ...t5Template, type: 'RobertaProcessing' } })).toThrow(
      `${expected}; it is [{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"</s>","type_id":0}}]`,
    );
    // a special token before the prompt (BERT's [CLS] $A)
    const clsFirst = [{ SpecialToken: { id: '</s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }];
    expect(() => new Umt5Tokenizer({ ...t5, post_processor: { ...t5Template, single: clsFirst } })).toThrow(
      `${expected}; it is ${JSON.stringify(clsFirst)}`,
    );
    for (const special_tokens of [
      {},
      { '</s>': { id: '</s>' } },
      { '</s>': { id: '</s>', ids: [1.5] } },
      { '</s>': { id: '</s>', ids: [1, 1.5] } },
      undefined,
    ])
      expect(
        () => new Umt5Tokenizer({ ...t5, post_processor: { ...t5Template, special_tokens } }),
        JSON.stringify(special_tokens),
      ).toThrow(`${expected} with the ids of its special tokens; it is [{"Sequence"`);
    // its special tokens' ids, as the template gives them
    const twoClosing = {
      ...t5Template,
      single: [
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
        { SpecialToken: { id: '<pad>', type_id: 0 } },
      ],
      special_tokens: { '</s>': { id: '</s>', ids: [1] }, '<pad>': { id: '<pad>', ids: [0] } },
    };
    expect(new Umt5Tokenizer({ ...t5, post_processor: twoClosing }).encode('a red', 512).ids).toEqual([3, 4, 1, 0]);
  });

  it("with Metaspace's split: false, lets a piece run across a space, as the Rust library does", () => {
    const json = makeTestTokenizerJson(['▁red▁ball', '▁red', '▁ball']);
    const unsplit = { ...json, pre_tokenizer: { ...(json.pre_tokenizer as object), split: false } };
    expect(new Umt5Tokenizer(unsplit).encode('red ball', 512).ids).toEqual([3, 1]);
  });
});

describe('makeTestTokenizerJson', () => {
  it("writes T5TokenizerFast's layout: specials 0-2, the pieces, then ▁ and ASCII", () => {
    const json = makeTestTokenizerJson(['▁a', 'x']);
    expect(
      (json.added_tokens as { id: number; content: string; special: boolean }[]).map((t) => [
        t.id,
        t.content,
        t.special,
      ]),
    ).toEqual([
      [0, '<pad>', true],
      [1, '</s>', true],
      [2, '<unk>', true],
    ]);
    expect(json.model.type).toBe('Unigram');
    expect(json.model.unk_id).toBe(2);
    const vocab = json.model.vocab;
    expect(vocab.slice(0, 6)).toEqual([
      ['<pad>', 0],
      ['</s>', 0],
      ['<unk>', 0],
      ['▁a', -1],
      ['x', -1.5],
      ['▁', -10],
    ]);
    expect(vocab.filter(([piece]) => piece === 'x')).toHaveLength(1); // a piece is not repeated as a character
    expect(vocab).toHaveLength(3 + 2 + 1 + 94 - 1);
    const scores = vocab.slice(3).map(([, score]) => score);
    expect(scores.every((score, i) => i === 0 || score < scores[i - 1])).toBe(true);
    expect(vocab.at(-1)).toEqual(['~', -10 - 93 / 94]);
  });

  it("writes the rest as tokenizers writes T5TokenizerFast's: flags, normalizer, Metaspace, the templates, no byte fallback", () => {
    const json = makeTestTokenizerJson(['▁a']);
    expect(json.added_tokens).toEqual(
      ['<pad>', '</s>', '<unk>'].map((content, id) => ({
        id,
        content,
        single_word: false,
        lstrip: false,
        rstrip: false,
        normalized: false,
        special: true,
      })),
    );
    const metaspace = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true };
    const A = { Sequence: { id: 'A', type_id: 0 } };
    const B = { Sequence: { id: 'B', type_id: 0 } };
    const closing = { SpecialToken: { id: '</s>', type_id: 0 } };
    expect({ ...json, model: undefined, added_tokens: undefined }).toEqual({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: undefined,
      normalizer: {
        type: 'Sequence',
        normalizers: [{ type: 'NFKC' }, { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' }],
      },
      pre_tokenizer: metaspace,
      post_processor: {
        type: 'TemplateProcessing',
        single: [A, closing],
        pair: [A, closing, B, closing],
        special_tokens: { '</s>': { id: '</s>', ids: [1], tokens: ['</s>'] } },
      },
      decoder: metaspace,
      model: undefined,
    });
    expect(json.model.byte_fallback).toBe(false);
  });
});
