import type { FullConfig, Reporter, Suite, TestCase, TestResult } from '@playwright/test/reporter';

// Every e2e test that did not run, and why, at the end of the run: a test that skips itself (no LAN address, no
// network namespaces, an opt-in test) must say so where whoever reads the run looks, not only in an HTML report.
export default class Skips implements Reporter {
  private readonly skipped: string[] = [];
  private tier: string | null = null;

  onBegin(_config: FullConfig, suite: Suite): void {
    // playwright.config.ts runs the @ci tier unless asked for all: the others did not run, by choice
    if (process.env.DITSWARM_E2E !== 'full')
      this.tier = `the @ci tier's ${suite.allTests().length} e2e tests ran; \`npm run test:e2e:full\` runs every one`;
  }

  onTestEnd(test: TestCase, result: TestResult): void {
    if (result.status !== 'skipped') return;
    const why = [...result.annotations, ...test.annotations].find((a) => a.type === 'skip')?.description;
    this.skipped.push(
      `${test.titlePath().filter(Boolean).join(' › ')}: ${why ?? 'skipped without a reason (say why)'}`,
    );
  }

  onEnd(): void {
    if (this.tier) console.log(`\n${this.tier}`);
    if (!this.skipped.length) return;
    console.log(`\n${this.skipped.length} e2e test(s) did not run:`);
    for (const line of this.skipped) console.log(`  - ${line}`);
  }
}
