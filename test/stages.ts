// `npm test`: every check in turn, stopping at the first that fails, then how long each took, so that a suite grown
// too slow for CI (issue 66: well under 20 minutes on 2 cores) says where its time went, and what grew.
import { spawnSync } from 'node:child_process';

const STAGES: readonly { name: string; command: string }[] = [
  // what the end-to-end tests need from the machine, checked in the first second rather than after minutes
  { name: 'preflight', command: 'tsx server/cli/preflight.ts' },
  { name: 'lint', command: 'npm run lint' },
  { name: 'typecheck', command: 'npm run typecheck' },
  { name: 'unit', command: 'npm run test:unit' },
  { name: 'bench smoke', command: 'npm run bench -- --smoke' },
  { name: 'e2e', command: 'npm run test:e2e' },
];

const took: string[] = [];
const started = Date.now();
let failed: { name: string; status: number } | null = null;
for (const { name, command } of STAGES) {
  const stageStarted = Date.now();
  const { status, signal } = spawnSync(command, { shell: true, stdio: 'inherit' });
  took.push(`${name} ${Math.round((Date.now() - stageStarted) / 1000)} s`);
  if (status !== 0) {
    failed = { name, status: status ?? (signal ? 128 : 1) };
    break;
  }
}
const total = `${Math.round((Date.now() - started) / 1000)} s`;
console.log(`\nnpm test: ${took.join(', ')}; ${total} in all${failed ? `; stopped: ${failed.name} failed` : ''}`);
process.exit(failed?.status ?? 0);
