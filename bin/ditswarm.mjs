#!/usr/bin/env node
// `npx ditswarm worker LINK` (from a checkout: `npm run worker -- LINK`): this machine joins a swarm as a worker
// process (worker/node/main.ts). The repository is TypeScript run by tsx, whose loader this puts in place first.
import { register } from 'tsx/esm/api';

const [command, ...args] = process.argv.slice(2);
if (command !== 'worker') {
  console.error(`usage: ditswarm worker <worker link> [--threads N] [--cache DIR] … (ditswarm worker --help)`);
  process.exit(2);
}
register();
process.argv = [process.argv[0], 'ditswarm worker', ...args];
await import('../worker/node/main.ts');
