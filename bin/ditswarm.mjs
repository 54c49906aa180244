#!/usr/bin/env node
// `npx ditswarm start [flags]` (from a checkout: `npm start -- [flags]`): the server, its dashboard and worker
// pages, and with --api the video API (server/main.ts). `npx ditswarm worker LINK` (from a checkout:
// `npm run worker -- LINK`): this machine joins a swarm as a worker process (worker/node/main.ts). An installed
// package runs its built JavaScript (dist/lib, `npm run build:lib`); a checkout has the TypeScript, run by tsx's
// loader, put in place first.
import { existsSync } from 'node:fs';
import { URL } from 'node:url';

const COMMANDS = { start: 'server/main', worker: 'worker/node/main', generate: 'server/cli/generate' };
const [command, ...args] = process.argv.slice(2);
if (!Object.hasOwn(COMMANDS, command)) {
  console.error(
    'usage: ditswarm start [--port N] [--model PATH|URL] [--api] …   the server: dashboard, worker pages, video API\n' +
      '       ditswarm worker <worker link> [--threads N] [--cache DIR] …   join a swarm (ditswarm worker --help)\n' +
      '       ditswarm generate --prompt TEXT [--workers N] …   a job on this machine (ditswarm generate --help)',
  );
  process.exit(2);
}
const source = new URL(`../${COMMANDS[command]}.ts`, import.meta.url);
const checkout = existsSync(source);
if (checkout) (await import('tsx/esm/api')).register();
process.argv = [process.argv[0], `ditswarm ${command}`, ...args];
await import(checkout ? source.href : new URL(`../dist/lib/${COMMANDS[command]}.js`, import.meta.url).href);
