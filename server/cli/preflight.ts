// `npm test`'s first step: what the end-to-end tests need from the machine, checked in its first
// second rather than after minutes of unit tests, with the one command that provides it.
import { spawnSync } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { chromiumExecutable } from '../chromium.ts';

const chromium = chromiumExecutable();
const missing: string[] = [];
try {
  accessSync(chromium, constants.X_OK);
} catch {
  missing.push(
    process.env.CHROMIUM
      ? `Chromium for its end-to-end tests, but CHROMIUM=${chromium} is not an executable: ` +
          'point it at a Chromium or Chrome binary.'
      : `Chromium for its end-to-end tests, and ${chromium} is missing: ` +
          'run `sudo apt-get install -y chromium` (or set CHROMIUM=/path/to/chrome)',
  );
}
// the https tests trust the server's own CA in a browser's NSS database, as a worker's owner does once
if (spawnSync('certutil', ['-H']).error)
  missing.push('certutil for its https tests, and it is missing: run `sudo apt-get install -y libnss3-tools`');
if (missing.length) {
  const needs = missing.map((m) => `npm test needs ${m}`).join('\n');
  console.error(`${needs}\n(or \`bash .ci/run\`, which installs them and runs the tests)`);
  process.exit(1);
}
