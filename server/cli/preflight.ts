// `npm test`'s first step: what the end-to-end tests need from the machine, checked in its first
// second rather than after minutes of unit tests, with the one command that provides it.
import { accessSync, constants } from 'node:fs';
import { chromiumExecutable } from '../chromium.ts';

const chromium = chromiumExecutable();
try {
  accessSync(chromium, constants.X_OK);
} catch {
  console.error(
    process.env.CHROMIUM
      ? `npm test needs Chromium for its end-to-end tests, but CHROMIUM=${chromium} is not an executable: ` +
          'point it at a Chromium or Chrome binary.'
      : `npm test needs Chromium for its end-to-end tests, and ${chromium} is missing: ` +
          'run `sudo apt-get install -y chromium` (or set CHROMIUM=/path/to/chrome), ' +
          'or `bash .ci/run`, which installs it and runs the tests.',
  );
  process.exit(1);
}
