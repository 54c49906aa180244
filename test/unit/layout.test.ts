import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// The layout is the architecture: these specs keep data flowing one way between the folders.
const ROOT = resolve(import.meta.dirname, '../..');
const FOLDERS = ['app', 'coordinator', 'worker', 'rank', 'core', 'demo', 'server', 'bench', 'test'];

function sourceFiles(dir: string): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sourceFiles(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Every relative import of every source file (type-only ones too), as repo-relative paths. */
function importGraph(): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of FOLDERS.flatMap(sourceFiles)) {
    const text = readFileSync(join(ROOT, file), 'utf8');
    const specs = [...text.matchAll(/(?:from|import)\s*\(?\s*'(\.{1,2}\/[^']+)'/g)].map((m) => m[1]);
    graph.set(
      file,
      specs.map((s) => relative(ROOT, resolve(ROOT, dirname(file), s))),
    );
  }
  return graph;
}

/** Strongly connected components of more than one file, or a file importing itself (Tarjan). */
function cycles(graph: Map<string, string[]>): string[][] {
  const index = new Map<string, number>();
  const stack: string[] = [];
  const found: string[][] = [];
  /** Visits `v` and returns its low-link. */
  const visit = (v: string): number => {
    const vIndex = index.size;
    index.set(v, vIndex);
    let low = vIndex;
    stack.push(v);
    for (const w of graph.get(v) ?? []) {
      const wIndex = index.get(w);
      if (wIndex === undefined) low = Math.min(low, visit(w));
      else if (stack.includes(w)) low = Math.min(low, wIndex);
    }
    if (low === vIndex) {
      // v roots a component: it and everything stacked above it
      const component = stack.splice(stack.lastIndexOf(v));
      if (component.length > 1 || graph.get(v)?.includes(v)) found.push(component.sort());
    }
    return low;
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

const topFolder = (file: string) => file.split('/')[0];

/** Imports from files in `from` into files of the folders `to`, as "importer → imported". */
function crossings(graph: Map<string, string[]>, from: (file: string) => boolean, to: string[]): string[] {
  return [...graph].flatMap(([file, deps]) =>
    from(file) ? deps.filter((d) => to.includes(topFolder(d))).map((d) => `${file} → ${d}`) : [],
  );
}

describe('the source layout', () => {
  const graph = importGraph();

  it('reads every source file and its imports', () => {
    // a regex that found nothing would make every spec below pass vacuously
    expect(graph.size).toBeGreaterThan(100);
    expect(graph.get('coordinator/pipeline.ts')).toContain('core/job.ts');
  });

  it('has no import cycles', () => {
    expect(cycles(graph)).toEqual([]);
  });

  it('finds a cycle when there is one', () => {
    expect(
      cycles(
        new Map([
          ['a', ['b']],
          ['b', ['c']],
          ['c', ['a']],
          ['d', ['a']],
        ]),
      ),
    ).toEqual([['a', 'b', 'c']]);
  });

  it('keeps core/ free of every other folder', () => {
    expect(
      crossings(
        graph,
        (f) => topFolder(f) === 'core',
        FOLDERS.filter((f) => f !== 'core'),
      ),
    ).toEqual([]);
  });

  it('keeps rank/ compute free of the pages, the coordinator and the server', () => {
    expect(
      crossings(graph, (f) => topFolder(f) === 'rank', ['app', 'coordinator', 'worker', 'server', 'demo']),
    ).toEqual([]);
  });

  it('never lets the coordinator import the worker page', () => {
    expect(crossings(graph, (f) => topFolder(f) === 'coordinator', ['worker', 'app', 'server', 'demo'])).toEqual([]);
  });

  it('holds no training code under server/', () => {
    const training = ['demo/tape.ts', 'demo/adam.ts', 'demo/train.ts', 'demo/trainable-wan.ts', 'demo/gemm.ts'];
    expect(
      [...graph]
        .filter(([file, deps]) => topFolder(file) === 'server' && deps.some((d) => training.includes(d)))
        .map(([f]) => f),
    ).toEqual([]);
    expect([...graph.keys()].filter((f) => topFolder(f) === 'server' && /train|tape|adam|gemm/.test(f))).toEqual([]);
  });
});
