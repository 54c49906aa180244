import type { Reporter, TestCase, TestResult, TestStep } from '@playwright/test/reporter';

// Where an e2e run's time goes: every call, hook or expectation of a second and a half or more, with
// when it started. `npx playwright test <spec> --reporter=list,./test/e2e/step-times.reporter.ts`
const SHOWN_FROM_MS = 1500;
const SHOWN_CATEGORIES = new Set(['pw:api', 'hook', 'fixture', 'expect']);

export default class StepTimes implements Reporter {
  private readonly started = Date.now();

  onStepEnd(_test: TestCase, _result: TestResult, step: TestStep): void {
    if (step.duration < SHOWN_FROM_MS || !SHOWN_CATEGORIES.has(step.category)) return;
    const at = ((step.startTime.getTime() - this.started) / 1000).toFixed(1);
    const where = step.location ? `${step.location.file.split('/').pop() ?? ''}:${step.location.line}` : '';
    console.log(`  [${at} s +${(step.duration / 1000).toFixed(1)} s] ${step.category} ${step.title} ${where}`);
  }

  onTestEnd(test: TestCase, result: TestResult): void {
    console.log(`  ${test.title}: ${(result.duration / 1000).toFixed(1)} s, ${result.status}`);
  }
}
