// `npm test`: every check, stopping after the first step that fails, then how long each took, so that a suite grown
// too slow for CI (issue 66: well under 20 minutes on 2 cores) says where its time went, and what grew.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

interface Stage {
  name: string;
  command: string;
}

/**
 * Steps in order; a step's lanes run side by side, each lane's stages one after another. Lint and typecheck are one
 * single-threaded process each; the benchmarks' smoke run is mostly waiting (its tabs throttled to a fraction of a
 * core, its links paced, its swarms starting: 100 s of CPU in 320 s), so it runs beside them and the unit tests, which
 * start once lint has passed. The end-to-end tests time their workers' steps, so they run alone.
 */
const STEPS: readonly (readonly (readonly Stage[])[])[] = [
  // what the end-to-end tests need from the machine, checked in the first second rather than after minutes
  [[{ name: 'preflight', command: 'tsx server/cli/preflight.ts' }]],
  [
    [
      { name: 'lint', command: 'npm run lint' },
      { name: 'unit', command: 'npm run test:unit' },
    ],
    [{ name: 'typecheck', command: 'npm run typecheck' }],
    [{ name: 'bench smoke', command: 'npm run bench -- --smoke' }],
  ],
  [[{ name: 'e2e', command: 'npm run test:e2e' }]],
];

/**
 * Runs one stage, its output on ours (each line named by its stage where other lanes run beside it); resolves to its
 * exit status.
 */
function run({ name, command }: Stage, beside: boolean): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(command, { shell: true, stdio: beside ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    if (beside)
      for (const stream of [child.stdout, child.stderr])
        if (stream) createInterface({ input: stream }).on('line', (line) => console.log(`[${name}] ${line}`));
    child.on('exit', (status, signal) => resolve(status ?? (signal ? 128 : 1)));
  });
}

const took: string[] = [];
const started = Date.now();
let failed: { names: string[]; status: number } | null = null;
for (const lanes of STEPS) {
  const stepStarted = Date.now();
  const beside = lanes.length > 1;
  const outcomes = await Promise.all(
    lanes.map(async (lane) => {
      for (const stage of lane) {
        const status = await run(stage, beside);
        took.push(`${stage.name} ${Math.round((Date.now() - stepStarted) / 1000)} s`);
        if (status !== 0) return { name: stage.name, status };
      }
      return null;
    }),
  );
  const failures = outcomes.filter((o) => o !== null);
  if (failures.length) {
    failed = { names: failures.map((f) => f.name), status: failures[0].status };
    break;
  }
}
const total = `${Math.round((Date.now() - started) / 1000)} s`;
console.log(
  `\nnpm test: ${took.join(', ')} (each from its step's start); ${total} in all` +
    (failed ? `; stopped: ${failed.names.join(' and ')} failed` : ''),
);
process.exit(failed?.status ?? 0);
