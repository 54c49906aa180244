// `npm test`: every check in turn, stopping at the first that fails, then how long each took, so that a suite grown
// too slow for CI (issue 66: well under 20 minutes on 2 cores) says where its time went, and what grew.
import { spawn } from 'node:child_process';

interface Stage {
  name: string;
  command: string;
}

/**
 * Stages in order; the stages of one step run side by side. Lint and typecheck are each one single-threaded process,
 * so on 2 cores they take the time of the longer instead of both. The benchmarks' smoke run beside the unit tests was
 * tried and measured: each took as much longer as the other saved (the step 530 s against 541 s one after the other),
 * so they run one after the other, each on the whole machine.
 */
const STEPS: readonly (readonly Stage[])[] = [
  // what the end-to-end tests need from the machine, checked in the first second rather than after minutes
  [{ name: 'preflight', command: 'tsx server/cli/preflight.ts' }],
  [
    { name: 'lint', command: 'npm run lint' },
    { name: 'typecheck', command: 'npm run typecheck' },
  ],
  [{ name: 'unit', command: 'npm run test:unit' }],
  [{ name: 'bench smoke', command: 'npm run bench -- --smoke' }],
  [{ name: 'e2e', command: 'npm run test:e2e' }],
];

/** Runs one stage with its output on ours; resolves to its exit status. */
function run({ command }: Stage): Promise<number> {
  return new Promise((resolve) => {
    const child = spawn(command, { shell: true, stdio: 'inherit' });
    child.on('exit', (status, signal) => resolve(status ?? (signal ? 128 : 1)));
  });
}

const took: string[] = [];
const started = Date.now();
let failed: { names: string[]; status: number } | null = null;
for (const step of STEPS) {
  const stepStarted = Date.now();
  const statuses = await Promise.all(
    step.map(async (stage) => {
      const status = await run(stage);
      took.push(`${stage.name} ${Math.round((Date.now() - stepStarted) / 1000)} s`);
      return status;
    }),
  );
  const failedStages = step.filter((_, i) => statuses[i] !== 0);
  if (failedStages.length) {
    failed = { names: failedStages.map((s) => s.name), status: statuses.find((s) => s !== 0) ?? 1 };
    break;
  }
}
const total = `${Math.round((Date.now() - started) / 1000)} s`;
console.log(
  `\nnpm test: ${took.join(', ')}; ${total} in all${failed ? `; stopped: ${failed.names.join(' and ')} failed` : ''}`,
);
process.exit(failed?.status ?? 0);
