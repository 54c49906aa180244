// Makes docs/dashboard.png, the README's picture: `npm start` as a user runs it, the dashboard at the localhost link it
// prints, two worker tabs at the worker link it prints once the dashboard opens (so the picture also shows that link
// works), Enter on the prompt the form starts with, and the dashboard once the video is done. Not part of CI.
//
//   node --import tsx bench/dashboard-screenshot.ts [--out docs/dashboard.png]
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from '@playwright/test';
import { chromiumArgs, chromiumExecutable } from '../server/chromium.ts';
import { defined } from '../core/defined.ts';

const { values } = parseArgs({ options: { out: { type: 'string', default: 'docs/dashboard.png' } } });
const WORKERS = 2;

// a home of its own: the server's CA and join secret, which the picture shows links of, are thrown away after
const home = mkdtempSync(join(tmpdir(), 'ditswarm-screenshot-home-'));
const server = spawn(process.execPath, ['--import', 'tsx', 'server/main.ts', '--port', '0'], {
  stdio: ['ignore', 'pipe', 'inherit'],
  env: { ...process.env, HOME: home },
});
let printed = '';
const printedLine = (pattern: RegExp): Promise<RegExpExecArray> =>
  new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm start never printed ${pattern}:\n${printed}`)), 120_000);
    const look = () => {
      const found = pattern.exec(printed);
      if (!found) return;
      clearTimeout(timer);
      defined(server.stdout, "npm start's output").off('data', look);
      resolve(found);
    };
    defined(server.stdout, "npm start's output").on('data', look);
    look();
  });
defined(server.stdout, "npm start's output").on('data', (chunk: Buffer) => {
  printed += chunk.toString();
  process.stdout.write(chunk);
});

const profile = mkdtempSync(join(tmpdir(), 'ditswarm-screenshot-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: chromiumExecutable(),
  args: [...chromiumArgs],
  viewport: { width: 1280, height: 800 },
});
try {
  const [, dashboardUrl] = await printedLine(/^ {2}dashboard +(http:\/\/localhost:\d+\/)$/m);
  const dashboard = await context.newPage();
  await dashboard.goto(dashboardUrl);
  const { joinUrl } = await dashboard.evaluate(() => window.ditswarm.ready);
  // the worker link npm start printed as the dashboard opened: the dashboard's own
  const [, printedLink] = await printedLine(/^ {2}worker +(http:\/\/localhost:\d+\/worker\.html#token=\S+)/m);
  if (printedLink !== joinUrl) throw new Error(`npm start printed ${printedLink}, the dashboard shows ${joinUrl}`);
  for (let i = 0; i < WORKERS; i++) await (await context.newPage()).goto(printedLink);
  await dashboard.bringToFront();
  await dashboard.waitForFunction((n) => window.ditswarm.workerCount() >= n, WORKERS, { timeout: 120_000 });
  await dashboard.locator('textarea[name=prompt]').press('Enter');
  await dashboard.locator('#gallery li').first().waitFor({ timeout: 600_000 });
  // the video paused where the square is mid-way, as a reader would see it playing
  await dashboard.evaluate(async () => {
    const video = document.querySelector<HTMLVideoElement>('#video');
    if (!video) return;
    video.pause();
    if (video.readyState < 1)
      await new Promise((done) => video.addEventListener('loadedmetadata', done, { once: true }));
    video.currentTime = video.duration / 2;
    await new Promise((done) => video.addEventListener('seeked', done, { once: true }));
  });
  await dashboard.screenshot({ path: values.out, fullPage: true });
  console.log(`wrote ${values.out}`);
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  server.kill('SIGTERM');
  server.once('exit', () => rmSync(home, { recursive: true, force: true }));
}
