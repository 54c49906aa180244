// The prompt tokenizer of Wan2.1's umT5 text encoder: diffusers' WanPipeline cleans the prompt
// (prompt_clean in pipeline_wan.py) and hands it to T5TokenizerFast, loaded from the folder's
// tokenizer/tokenizer.json, with truncation=True, max_length, add_special_tokens=True. The
// SentencePiece Unigram model itself runs in @huggingface/tokenizers (pure JS, browsers and Node);
// this file adds what that library leaves out: the prompt cleaning, Metaspace's word split and
// the truncation that keeps the closing </s>.

import { MetaspacePreTokenizer, Tokenizer } from '@huggingface/tokenizers';

export interface PromptTokens {
  /** at most maxLength ids, the last one </s> (id 1 in umT5) */
  ids: number[];
  truncated: boolean;
  /** the prompt's length in tokens before truncation, </s> included */
  tokens: number;
}

/** The folder's tokenizer.json is not one this port can run (its message says what it is). */
export class UnsupportedTokenizer extends Error {
  override name = 'UnsupportedTokenizer';
}

// ---- prompt_clean (diffusers pipeline_wan.py) ----

/** prompt_clean: whitespace_clean(basic_clean(text)). */
export function cleanPrompt(text: string): string {
  return whitespaceClean(basicClean(text));
}

// basic_clean starts with ftfy.fix_text, which has no JS port, and none of it is done here. With
// its defaults ftfy repairs mojibake (a guess we will not make), unescapes HTML entities until none
// is left (unless the text looks like HTML), straightens curly quotes, drops control characters and
// the BOM, and NFC-normalizes; the ligatures and full-width forms it also fixes are mapped anyway
// by the tokenizer's NFKC.
function basicClean(text: string): string {
  return pythonStrip(htmlUnescape(htmlUnescape(text)));
}

function whitespaceClean(text: string): string {
  return pythonStrip(text.replace(PYTHON_WHITESPACE_RUN, ' '));
}

// Python's \s and str.strip() on str: str.isspace(), which differs from JS's \s (it includes
// \x1c-\x1f and \x85, and not \ufeff).
const PYTHON_WHITESPACE =
  '[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const PYTHON_WHITESPACE_RUN = new RegExp(`${PYTHON_WHITESPACE}+`, 'g');
const PYTHON_STRIP = new RegExp(`^${PYTHON_WHITESPACE}+|${PYTHON_WHITESPACE}+$`, 'g');

function pythonStrip(text: string): string {
  return text.replace(PYTHON_STRIP, '');
}

// ---- html.unescape (CPython Lib/html/__init__.py) ----

// Python's _charref; `u` so that the 32-character limit counts code points, as Python does.
const CHAR_REF = /&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)/gu;

// The entities of Python's html5 table that prompts carry; the other ~2,200 (&eacute;, &hellip;,
// ...) are left as written. Names without ';' are the legacy forms HTML accepts bare.
const NAMED_ENTITIES = new Map<string, string>([
  ['amp;', '&'],
  ['amp', '&'],
  ['AMP;', '&'],
  ['AMP', '&'],
  ['lt;', '<'],
  ['lt', '<'],
  ['LT;', '<'],
  ['LT', '<'],
  ['gt;', '>'],
  ['gt', '>'],
  ['GT;', '>'],
  ['GT', '>'],
  ['quot;', '"'],
  ['quot', '"'],
  ['QUOT;', '"'],
  ['QUOT', '"'],
  ['apos;', "'"],
  ['nbsp;', '\u00a0'],
  ['nbsp', '\u00a0'],
]);

// Python's _invalid_charrefs for &#128;..&#159;: what a browser shows, windows-1252 (its five
// undefined bytes stay C1 controls).
const WINDOWS_1252_C1 =
  '\u20ac\x81\u201a\u0192\u201e\u2026\u2020\u2021\u02c6\u2030\u0160\u2039\u0152\x8d\u017d\x8f' +
  '\x90\u2018\u2019\u201c\u201d\u2022\u2013\u2014\u02dc\u2122\u0161\u203a\u0153\x9d\u017e\u0178';

function htmlUnescape(text: string): string {
  return text.replace(CHAR_REF, (_, ref: string) => (ref[0] === '#' ? numericCharRef(ref) : namedCharRef(ref)));
}

function numericCharRef(ref: string): string {
  const hex = ref[1] === 'x' || ref[1] === 'X';
  const code = parseInt(ref.slice(hex ? 2 : 1), hex ? 16 : 10); // parseInt stops at the ';'
  if (code === 0) return '\ufffd';
  if (code >= 0x80 && code <= 0x9f) return WINDOWS_1252_C1[code - 0x80];
  if ((code >= 0xd800 && code <= 0xdfff) || code > 0x10ffff) return '\ufffd';
  if (isInvalidCodePoint(code)) return '';
  return String.fromCodePoint(code);
}

// Python's _invalid_codepoints (C1 controls were answered above).
function isInvalidCodePoint(code: number): boolean {
  return (
    // Stryker disable next-line ConditionalExpression: code 0 was answered above, so code >= 0x1 holds here
    (code >= 0x1 && code <= 0x8) ||
    code === 0xb ||
    (code >= 0xe && code <= 0x1f) ||
    code === 0x7f ||
    (code >= 0xfdd0 && code <= 0xfdef) ||
    (code & 0xfffe) === 0xfffe
  );
}

function namedCharRef(ref: string): string {
  const whole = NAMED_ENTITIES.get(ref);
  if (whole !== undefined) return whole;
  // the longest legacy name the reference starts with: "&ampx" reads as "&x"
  // Stryker disable next-line ArithmeticOperator,EqualityOperator: no name is 1 character; slices past the end are ref
  for (let end = ref.length - 1; end > 1; end--) {
    const prefix = NAMED_ENTITIES.get(ref.slice(0, end));
    if (prefix !== undefined) return prefix + ref.slice(end);
  }
  return '&' + ref;
}

// ---- T5TokenizerFast ----

export class Umt5Tokenizer {
  private readonly tokenizer: Tokenizer;
  /** the ids T5's post_processor ("$A </s>") appends: [1] */
  private readonly closingIds: number[];

  /** tokenizerJson: the folder's tokenizer/tokenizer.json, parsed; tokenizerConfig: its tokenizer_config.json. */
  constructor(tokenizerJson: unknown, tokenizerConfig: unknown = {}) {
    const json = asObject(tokenizerJson, 'tokenizer/tokenizer.json');
    const model = asObject(json.model, 'tokenizer/tokenizer.json: model');
    if (model.type !== 'Unigram') {
      throw new UnsupportedTokenizer(
        `tokenizer/tokenizer.json is a ${String(model.type)} tokenizer; a T5 (Unigram) one was expected`,
      );
    }
    this.closingIds = closingIdsOfTemplate(json.post_processor);
    this.tokenizer = new Tokenizer(json, asObject(tokenizerConfig, 'tokenizer/tokenizer_config.json'));
    const preTokenizer = json.pre_tokenizer as { type?: unknown; split?: unknown } | null | undefined;
    if (preTokenizer?.type === 'Metaspace' && preTokenizer.split !== false) {
      this.tokenizer.pre_tokenizer = new WordSplittingMetaspace(
        preTokenizer as ConstructorParameters<typeof MetaspacePreTokenizer>[0],
      );
    }
  }

  /** The prompt's ids as the pipeline gives them to the text encoder (before padding to maxLength). */
  encode(prompt: string, maxLength: number): PromptTokens {
    if (!Number.isInteger(maxLength) || maxLength < this.closingIds.length) {
      throw new RangeError(
        `maxLength must be an integer of at least ${this.closingIds.length} (room for </s>); got ${maxLength}`,
      );
    }
    const content = this.tokenizer.encode(cleanPrompt(prompt), { add_special_tokens: false }).ids;
    const tokens = content.length + this.closingIds.length;
    const truncated = tokens > maxLength;
    // transformers truncates the content to max_length minus the tokens the post_processor will
    // add, then adds them: a truncated prompt still ends with </s>.
    const kept = truncated ? content.slice(0, maxLength - this.closingIds.length) : content;
    return { ids: [...kept, ...this.closingIds], truncated, tokens };
  }
}

// Metaspace with split: true (the Rust library's default when the field is absent) makes every ▁
// start a word of its own, and the Unigram model segments each word apart. tokenizers.js 0.2.0
// ignores `split` and segments the whole prompt at once, where a piece could run across a space.
class WordSplittingMetaspace extends MetaspacePreTokenizer {
  override pre_tokenize_text(
    text: string,
    options?: Parameters<MetaspacePreTokenizer['pre_tokenize_text']>[1],
  ): string[] {
    return super.pre_tokenize_text(text, options).flatMap((spaced) => {
      const words = spaced.split(this.replacement).map((word, i) => (i === 0 ? word : this.replacement + word));
      // Stryker disable next-line MethodExpression,ConditionalExpression,StringLiteral: Unigram makes no token of ''
      return words.filter((word) => word !== '');
    });
  }
}

/** T5's post_processor: TemplateProcessing whose single template is $A then special tokens (</s>). */
function closingIdsOfTemplate(postProcessor: unknown): number[] {
  const expected = 'T5\'s TemplateProcessing with single "$A </s>"';
  const template = asObject(postProcessor, `tokenizer/tokenizer.json: post_processor (${expected})`);
  const single = template.single;
  const specials = template.special_tokens as Record<string, { ids?: unknown }> | undefined;
  const got = JSON.stringify(single ?? template.type);
  const first = Array.isArray(single) ? (single[0] as { Sequence?: { id?: unknown } } | undefined) : undefined;
  if (template.type !== 'TemplateProcessing' || !Array.isArray(single) || first?.Sequence?.id !== 'A') {
    throw new UnsupportedTokenizer(`tokenizer/tokenizer.json: post_processor must be ${expected}; it is ${got}`);
  }
  return single.slice(1).flatMap((item: { SpecialToken?: { id?: string } }) => {
    const ids = item.SpecialToken?.id === undefined ? undefined : specials?.[item.SpecialToken.id]?.ids;
    if (!Array.isArray(ids) || !ids.every(Number.isInteger)) {
      throw new UnsupportedTokenizer(
        `tokenizer/tokenizer.json: post_processor must be ${expected} with the ids of its special tokens; ` +
          `it is ${got}`,
      );
    }
    return ids as number[];
  });
}

function asObject(value: unknown, what: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new UnsupportedTokenizer(
      `${what} must be a JSON object; ` +
        `it is ${value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value}`,
    );
  }
  return value as Record<string, unknown>;
}

// ---- test tokenizers ----

/** A Unigram tokenizer.json: its vocabulary of [piece, log-probability], the rest as tokenizers writes it. */
export interface TokenizerJson {
  model: { type: 'Unigram'; unk_id: number; vocab: [string, number][]; byte_fallback: boolean };
  [field: string]: unknown;
}

/** The pieces of the test models' tokenizer (make-model): the demo's prompts' words, so they tokenize to words. */
export const TEST_TOKENIZER_PIECES = [
  '▁a',
  '▁the',
  '▁red',
  '▁green',
  '▁blue',
  '▁yellow',
  '▁ball',
  '▁square',
  '▁circle',
  '▁cat',
  '▁dog',
  '▁moving',
  '▁right',
  '▁left',
  '▁up',
  '▁down',
  '▁on',
  '▁in',
  '▁and',
  '▁of',
  'ing',
  's',
];

/**
 * A tokenizer.json as huggingface `tokenizers` writes T5TokenizerFast's, with a small vocabulary:
 * <pad> 0, </s> 1, <unk> 2, then `pieces` with decreasing log-probabilities (all above -2, so
 * fewer pieces always win), then ▁ and the printable ASCII characters not among them (all below
 * -10), so that any ASCII prompt tokenizes without <unk>. The published normalizer is Precompiled
 * (SentencePiece's nmt_nfkc charsmap, a binary blob only SentencePiece writes) then Replace of
 * space runs; here NFKC, the heart of nmt_nfkc and run alike by both libraries, stands in for it.
 */
export function makeTestTokenizerJson(pieces: string[]): TokenizerJson {
  const special = (id: number, content: string) => ({
    id,
    content,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  });
  const metaspace = { type: 'Metaspace', replacement: '▁', prepend_scheme: 'always', split: true };
  const ascii = Array.from({ length: 0x7e - 0x21 + 1 }, (_, i) => String.fromCharCode(0x21 + i));
  const characters = ['▁', ...ascii].filter((c) => !pieces.includes(c));
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: [special(0, '<pad>'), special(1, '</s>'), special(2, '<unk>')],
    normalizer: {
      type: 'Sequence',
      normalizers: [{ type: 'NFKC' }, { type: 'Replace', pattern: { Regex: ' {2,}' }, content: ' ' }],
    },
    pre_tokenizer: metaspace,
    post_processor: {
      type: 'TemplateProcessing',
      single: [{ Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '</s>', type_id: 0 } }],
      pair: [
        { Sequence: { id: 'A', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
        { Sequence: { id: 'B', type_id: 0 } },
        { SpecialToken: { id: '</s>', type_id: 0 } },
      ],
      special_tokens: { '</s>': { id: '</s>', ids: [1], tokens: ['</s>'] } },
    },
    decoder: metaspace,
    model: {
      type: 'Unigram',
      unk_id: 2,
      vocab: [
        ['<pad>', 0],
        ['</s>', 0],
        ['<unk>', 0],
        ...pieces.map((piece, i): [string, number] => [piece, -1 - i / pieces.length]),
        ...characters.map((c, i): [string, number] => [c, -10 - i / characters.length]),
      ],
      byte_fallback: false,
    },
  };
}
