import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseBlockCostArgs } from '../../bench/block-cost.ts';
import { parseFullSizeArgs } from '../../bench/full-size.ts';
import { parseHandOffArgs } from '../../bench/handoff.ts';
import { parseLinksArgs } from '../../bench/links.ts';
import { parseLoadArgs } from '../../bench/load.ts';
import { parseOverheadArgs } from '../../bench/local-overhead.ts';
import { parseApiPollsArgs } from '../../bench/api-polls.ts';
import { parseNodeWorkerArgs } from '../../bench/node-worker.ts';
import { parsePooledArgs } from '../../bench/pooled.ts';
import { parseScalingArgs } from '../../bench/scaling.ts';
import { parseSignalingArgs } from '../../bench/signaling.ts';
import { parseSlowLinkArgs } from '../../bench/slow-link.ts';
import { parseSpotCheckOverheadArgs } from '../../bench/spot-check-overhead.ts';
import { parseThreadsArgs } from '../../bench/threads.ts';
import { parseTimeToVideoArgs } from '../../bench/time-to-video.ts';
import { parseUnevenArgs } from '../../bench/uneven.ts';
import { parseVaeArgs } from '../../bench/vae.ts';
import { parseFirstJobArgs } from '../../bench/first-job.ts';
import type { Benchmark } from '../../bench/names.ts';
import { EVAL_DEMO_OPTIONS } from '../../demo/cli/flags.ts';
import {
  DECODE_OPTIONS,
  ENCODE_IMAGE_OPTIONS,
  ENCODE_PROMPT_OPTIONS,
  FORWARD_OPTIONS,
  GENERATE_OPTIONS,
  MAKE_LORA_OPTIONS,
  MAKE_MODEL_OPTIONS,
} from '../../server/cli/flags.ts';
import { startBanner, workerLinkLines, workerLinks, type StartFacts } from '../../server/start-banner.ts';
import { START_OPTIONS } from '../../server/start-flags.ts';
import { WORKER_OPTIONS } from '../../worker/node/flags.ts';

// The docs stay true to the code: every flag they name beside a command is one its parser takes, every `npm run` a
// script of package.json, every relative link a file (and heading) that is there, and what they quote of
// `npm start`'s output is what it prints.
const ROOT = resolve(import.meta.dirname, '../..');
const PAGES = [
  'README.md',
  ...readdirSync(join(ROOT, 'docs')).flatMap((f) => (f.endsWith('.md') ? [`docs/${f}`] : [])),
];
const SCRIPTS = Object.keys(
  (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: object }).scripts,
);

/** whether a command takes `--flag` */
type FlagCheck = (flag: string) => boolean;
const ofOptions =
  (options: object): FlagCheck =>
  (flag) =>
    Object.hasOwn(options, flag);
/** a benchmark's parser, handed the flag alone: it may refuse its missing value, but not the flag */
const ofParser =
  (parse: (args: string[]) => unknown): FlagCheck =>
  (flag) => {
    try {
      parse([`--${flag}`]);
      return true;
    } catch (e) {
      return (e as { code?: string }).code !== 'ERR_PARSE_ARGS_UNKNOWN_OPTION';
    }
  };

/** Each benchmark's flags: the compiler asks for one entry a benchmark bench/names.ts lists. */
const BENCHMARK_FLAGS: Record<Benchmark, FlagCheck> = {
  'block-cost': ofParser(parseBlockCostArgs),
  projection: ofOptions({}),
  'local-overhead': ofParser(parseOverheadArgs),
  scaling: ofParser(parseScalingArgs),
  threads: ofParser(parseThreadsArgs),
  'full-size': ofParser(parseFullSizeArgs),
  pooled: ofParser(parsePooledArgs),
  handoff: ofParser(parseHandOffArgs),
  vae: ofParser(parseVaeArgs),
  uneven: ofParser(parseUnevenArgs),
  'slow-link': ofParser(parseSlowLinkArgs),
  'spot-check-overhead': ofParser(parseSpotCheckOverheadArgs),
  'time-to-video': ofParser(parseTimeToVideoArgs),
  'first-job': ofParser(parseFirstJobArgs),
  load: ofParser(parseLoadArgs),
  'api-polls': ofParser(parseApiPollsArgs),
  'node-worker': ofParser(parseNodeWorkerArgs),
  signaling: ofParser(parseSignalingArgs),
  links: ofParser(parseLinksArgs),
};

/** Each command the docs name flags of, as `npm run NAME` (`npx ditswarm NAME` is the same; `npm start` is start). */
const COMMANDS: Partial<Record<string, FlagCheck>> = {
  start: ofOptions(START_OPTIONS),
  worker: ofOptions(WORKER_OPTIONS),
  generate: ofOptions(GENERATE_OPTIONS),
  // hands every flag on to generate
  'calibrate-cache': ofOptions(GENERATE_OPTIONS),
  forward: ofOptions(FORWARD_OPTIONS),
  decode: ofOptions(DECODE_OPTIONS),
  'encode-prompt': ofOptions(ENCODE_PROMPT_OPTIONS),
  'encode-image': ofOptions(ENCODE_IMAGE_OPTIONS),
  'make-model': ofOptions(MAKE_MODEL_OPTIONS),
  'make-lora': ofOptions(MAKE_LORA_OPTIONS),
  'eval-demo': ofOptions(EVAL_DEMO_OPTIONS),
  bench: (flag) => flag === 'smoke',
  ...Object.fromEntries(Object.entries(BENCHMARK_FLAGS).map(([name, check]) => [`bench ${name}`, check])),
};

/** A piece of code on a page: a line of a fenced block, a table's row, or an inline code span. */
interface Snippet {
  page: string;
  line: number;
  text: string;
  /** the command of the section a table row is in ("## npm start"), which its flags belong to */
  section: string | null;
}

/** Each fenced block's lines, and each code span of the rest, of `text`. */
function snippets(page: string, text: string): Snippet[] {
  const found: Snippet[] = [];
  let fenced = false;
  let section: string | null = null;
  let paragraph: { line: number; text: string } | null = null;
  // a shell line that goes on after a backslash, from its first line
  let continued: { line: number; text: string } | null = null;
  const endParagraph = () => {
    for (const [, code] of (paragraph?.text ?? '').matchAll(/`([^`]+)`/g))
      found.push({ page, line: paragraph?.line ?? 0, text: code, section: null });
    paragraph = null;
  };
  text.split('\n').forEach((line, i) => {
    if (line.startsWith('```')) {
      endParagraph();
      fenced = !fenced;
    } else if (fenced) {
      const whole = continued ? { ...continued, text: `${continued.text} ${line}` } : { line: i + 1, text: line };
      continued = line.endsWith('\\') ? whole : null;
      if (!continued) found.push({ page, ...whole, section: null });
    } else if (/^#+ /.test(line)) {
      endParagraph();
      section = commandsIn(line)[0]?.command ?? null;
    } else if (line.startsWith('|')) {
      endParagraph();
      const first = line.split(/(?<!\\)\|/).at(1) ?? '';
      for (const [, code] of first.matchAll(/`([^`]+)`/g)) found.push({ page, line: i + 1, text: code, section });
    } else if (line.trim() === '') endParagraph();
    else paragraph = paragraph ? { ...paragraph, text: `${paragraph.text} ${line}` } : { line: i + 1, text: line };
  });
  endParagraph();
  return found;
}

/** The flags a piece of code names. */
const flagsOf = (code: string) => [...code.matchAll(/(?<![\w-])--([a-z][a-z0-9-]*)/g)].map(([, flag]) => flag);

/** The commands a snippet names, each with the flags after it (up to the next command, a comment or `&&`). */
function commandsIn(text: string): { command: string; flags: string[] }[] {
  const named = [
    ...text.matchAll(/npm start|npx ditswarm ([a-z][a-z-]*)|npm run ([a-z][a-z0-9:-]*)(?:\s+--\s+([a-z][a-z-]*))?/g),
  ];
  return named.map((m, i) => {
    const [, npx, script, bench] = [...m] as (string | undefined)[];
    const command = npx ?? (script === 'bench' && bench ? `bench ${bench}` : (script ?? 'start'));
    const rest = text.slice(m.index + m[0].length, named.at(i + 1)?.index ?? text.length).split(/ #|&&|;/)[0];
    return { command, flags: flagsOf(rest) };
  });
}

/** Each command and flag the pages name together, and where. */
function commandFlags(pages: Record<string, string>): { where: string; command: string; flag: string }[] {
  return Object.entries(pages).flatMap(([page, text]) =>
    snippets(page, text).flatMap(({ line, text: code, section }) => {
      const named = commandsIn(code);
      const uses = named.length ? named : section ? [{ command: section, flags: flagsOf(code) }] : [];
      return uses.flatMap(({ command, flags }) => flags.map((flag) => ({ where: `${page}:${line}`, command, flag })));
    }),
  );
}

/** What each page names: "page:line: npm run X --flag" for each flag its command does not take. */
function unknownFlags(pages: Record<string, string>): string[] {
  return commandFlags(pages).flatMap(({ where, command, flag }) => {
    const takes = COMMANDS[command];
    if (!takes) return [`${where}: no parser known for "${command}" (--${flag})`];
    return takes(flag) ? [] : [`${where}: ${command} has no --${flag}`];
  });
}

const scriptsNamed = (text: string) => [...text.matchAll(/npm run ([a-z][a-z0-9:-]*)/g)].map(([, script]) => script);

/** Each `npm run X` of the pages whose X is no script of package.json, and `npm run bench -- Y` no benchmark. */
const unknownScripts = (pages: Record<string, string>) =>
  Object.entries(pages).flatMap(([page, text]) => [
    ...scriptsNamed(text).flatMap((script) => (SCRIPTS.includes(script) ? [] : [`${page}: ${script}`])),
    ...[...text.matchAll(/npm run bench -- ([a-z][a-z-]*)/g)].flatMap(([, name]) =>
      COMMANDS[`bench ${name}`] ? [] : [`${page}: bench ${name}`],
    ),
  ]);

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens; repeats numbered. */
function anchors(text: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  let fenced = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    const heading = !fenced && /^#+ (.*)$/.exec(line);
    if (!heading) continue;
    const slug = heading[1]
      .toLowerCase()
      .replace(/[^\p{L}\p{N} _-]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    out.add(n ? `${slug}-${n}` : slug);
  }
  return out;
}

/** Every relative link of a page that leads nowhere: a missing file, or a heading the file does not have. */
function brokenLinks(page: string, text: string): string[] {
  const prose = text.replace(/^```[\s\S]*?^```/gm, '').replace(/`[^`\n]*`/g, '');
  return [...prose.matchAll(/!?\[[^\]]*\]\(([^)\s]+)\)/g)].flatMap(([, target]) => {
    if (/^[a-z]+:/i.test(target)) return [];
    const [path, anchor] = target.split('#') as [string, string?];
    const file = path ? resolve(ROOT, dirname(page), path) : join(ROOT, page);
    if (!existsSync(file)) return [`${page}: ${target}: no file ${relative(ROOT, file)}`];
    if (anchor === undefined) return [];
    if (!file.endsWith('.md')) return [`${page}: ${target}: an anchor in a file that is not markdown`];
    return anchors(readFileSync(file, 'utf8')).has(anchor) ? [] : [`${page}: ${target}: no heading #${anchor}`];
  });
}

const read = (page: string) => readFileSync(join(ROOT, page), 'utf8');
const ALL = Object.fromEntries(PAGES.map((page) => [page, read(page)]));

describe('the docs', () => {
  it('README.md is read in a minute: at most 150 lines, the two commands at its top', () => {
    const readme = ALL['README.md'].split('\n');
    expect(readme.length).toBeLessThanOrEqual(150);
    const [install, test] = readme.filter((line) => /^npm (install|test)/.test(line));
    expect(install).toMatch(/^npm install && npm start /);
    expect(test).toMatch(/^npm test /);
  });

  it('name only flags their commands take', () => {
    const named = commandFlags(ALL);
    // the docs' flags are found: every command's table and examples
    expect(named.length).toBeGreaterThan(100);
    expect(new Set(named.map(({ command }) => command)).size).toBeGreaterThanOrEqual(10);
    expect(unknownFlags(ALL)).toEqual([]);
  });

  it('name only npm scripts package.json has, and only benchmarks npm run bench runs', () => {
    expect(Object.values(ALL).flatMap(scriptsNamed).length).toBeGreaterThan(50);
    expect(unknownScripts(ALL)).toEqual([]);
  });

  it("describe every top-level folder in architecture.md's Layout, server/api/ among them", () => {
    const ignored = new Set(
      readFileSync(join(ROOT, '.gitignore'), 'utf8')
        .split('\n')
        .map((line) => line.replace(/^\/|\/$/g, '')),
    );
    const folders = readdirSync(ROOT, { withFileTypes: true }).flatMap((e) =>
      e.isDirectory() && !e.name.startsWith('.') && !ignored.has(e.name) ? [e.name] : [],
    );
    expect(folders).toContain('server');
    const layout = ALL['docs/architecture.md'].split('\n## Layout\n')[1];
    expect(folders.filter((folder) => !layout.includes(`- \`${folder}/\``))).toEqual([]);
    expect(layout).toContain('`server/api/`');
  });

  it('link only to files and headings that are there', () => {
    expect(PAGES.flatMap((page) => brokenLinks(page, ALL[page]))).toEqual([]);
  });

  // the test of the tests: each kind of mistake is found
  it('would find a made-up flag (in a table, a code span, a shell line and its continuation), a flag of another command, a made-up script and a broken link', () => {
    const page = [
      '## npm start',
      '',
      '| flag | meaning |',
      '| --- | --- |',
      '| `--no-such-flag` | made up |',
      '',
      'Run `npm run generate -- --workers 2 --made-up 3`, then `npm run bench -- pooled --layers 4 --nor-this 1`.',
      '```sh',
      "npx ditswarm worker 'https://…' --threads 2 --stages 2   # --stages is generate's",
      'npm start -- --port 5173 \\',
      '  --turn-secret S --not-a-start-flag',
      '```',
    ].join('\n');
    expect(unknownFlags({ 'made-up.md': page })).toEqual([
      'made-up.md:5: start has no --no-such-flag',
      'made-up.md:7: generate has no --made-up',
      'made-up.md:7: bench pooled has no --nor-this',
      'made-up.md:9: worker has no --stages',
      'made-up.md:10: start has no --not-a-start-flag',
    ]);
    const misspelt = page.replace('npm run generate', 'npm run genrate').replace('-- pooled', '-- poled');
    expect(unknownScripts({ 'made-up.md': misspelt })).toEqual(['made-up.md: genrate', 'made-up.md: bench poled']);
    expect(brokenLinks('docs/x.md', '[a](api.md#no-such-heading) [b](nowhere.md) [c](api.md#the-calls)')).toEqual([
      'docs/x.md: api.md#no-such-heading: no heading #no-such-heading',
      'docs/x.md: nowhere.md: no file docs/nowhere.md',
    ]);
  });
});

describe("what the docs quote of npm start's output", () => {
  // the secrets of a run, shown in the docs as "…"
  const OWNER = '38ea34a9a5b0a7b11d28215b3076a617';
  const TOKEN = '124baa9234d1dcae41f24927.0a11526abfb5965c6a7214e981a4d9fd';
  const CA = 'b4639eda90faac6b0280182cabeb419cc5271d8ba4861e8f94f95b417ed16a69';
  const PEER_KEY = 'ditswarm-390e931a6241';
  const FACTS: StartFacts = {
    url: 'http://localhost:5173',
    port: 5173,
    requestedPort: 5173,
    lanOrigins: ['https://192.168.1.20:5173'],
    ownerKey: OWNER,
    caFingerprint: CA,
    loras: [],
    peerKey: PEER_KEY,
    iceUrls: [],
    relay: 'fallback',
  };
  const hidden = (lines: string[]) =>
    lines.map((line) =>
      [OWNER, TOKEN, CA, PEER_KEY, CA.toUpperCase().match(/../g)?.join(':') ?? ''].reduce(
        (l, secret) => l.replaceAll(secret, '…'),
        line,
      ),
    );
  const atStart = hidden(startBanner(FACTS)).filter((line) => line !== '');
  const { local, lan } = workerLinks(FACTS.url, FACTS.lanOrigins, TOKEN, CA);
  const asDashboardOpens = hidden(workerLinkLines(local, lan));

  /** the fenced blocks of `page` after its heading `heading`, up to the next heading of that level */
  function blocksUnder(page: string, heading: string): string[][] {
    const text = ALL[page];
    const from = text.indexOf(`\n${heading}\n`);
    expect(from, `${page} has "${heading}"`).toBeGreaterThanOrEqual(0);
    const level = heading.split(' ')[0];
    const rest = text.slice(from + heading.length + 2);
    const section = rest.slice(0, rest.search(new RegExp(`^${level} `, 'm')) >>> 0 || rest.length);
    return [...section.matchAll(/^```\n([\s\S]*?)^```/gm)].map(([, block]) => block.trimEnd().split('\n'));
  }

  it('is what it prints, in docs/command-line.md: at start, and when the dashboard opens', () => {
    const [start, opened] = blocksUnder('docs/command-line.md', '### What `npm start` prints');
    expect(start).toEqual(atStart);
    expect(opened).toEqual(asDashboardOpens);
  });

  it("is the start of what it prints, in README.md's Another machine joins", () => {
    const [quoted] = blocksUnder('README.md', '## Another machine joins');
    expect(quoted).toEqual(atStart.slice(0, quoted.length));
  });

  it('gives a worker link with its token, the dashboard first at localhost', () => {
    expect(atStart.slice(0, 3)).toEqual([
      'ditswarm is serving on port 5173',
      '  dashboard   http://localhost:5173/',
      '              https://192.168.1.20:5173/#owner=… (from your other machines: yours alone, it opens swarms here)',
    ]);
    expect(local).toBe(`http://localhost:5173/worker.html#token=${TOKEN}`);
    expect(lan).toEqual([`https://192.168.1.20:5173/worker.html#token=${TOKEN}&ca=${CA}`]);
  });
});
