import { defineConfig } from '@playwright/test';
import { chromiumArgs, chromiumExecutable } from './server/chromium.ts';

// End-to-end tests: several tabs of Debian's Chromium against one in-process ditswarm server.
export default defineConfig({
  testDir: 'test/e2e',
  workers: 1, // browsers in parallel would share the few cores and make every test's timings meaningless
  timeout: 180_000,
  // the list as tests run, then the ones that did not run and why
  reporter: [['list'], ['./test/e2e/skips.reporter.ts']],
  globalSetup: './test/e2e/global-setup.ts',
  // CI runs the tests tagged @ci (test/e2e/swarm-page.ts CI): one focused test of each part; `npm run test:e2e:full`
  // runs them all (DITSWARM_E2E=full)
  ...(process.env.DITSWARM_E2E !== 'full' && { grep: /@ci/ }),
  use: {
    // Set by global-setup.ts; workers re-read this file after it ran, so they see the value.
    baseURL: process.env.DITSWARM_URL,
    launchOptions: { executablePath: chromiumExecutable(), args: [...chromiumArgs] },
  },
});
