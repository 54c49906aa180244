// How every ditswarm browser is launched (Playwright tests, `npm run generate`, benchmarks).

/** Debian's chromium; set CHROMIUM to use another build. Never `npx playwright install`. */
export function chromiumExecutable(): string {
  return process.env.CHROMIUM ?? '/usr/bin/chromium';
}

/**
 * Without it headless Chromium 156 has navigator.gpu but requestAdapter() returns null;
 * with it a secure context (http://localhost) gets the SwiftShader fallback adapter.
 */
export const WEBGPU_ARG = '--enable-unsafe-webgpu';

export const chromiumArgs: readonly string[] = [
  WEBGPU_ARG,
  '--no-sandbox',
  // Worker pages usually sit in background tabs; their timers and rendering must keep pace.
  '--disable-background-timer-throttling',
  '--disable-renderer-backgrounding',
  '--disable-backgrounding-occluded-windows',
  // No traffic to Google services: the machine may be offline and benchmarks stay quiet.
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];
