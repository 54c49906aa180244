// The queue: one line per unfinished job with its own progress bar and ETA. Lines are kept and
// updated in place (no re-layout when a step completes).

import { describeLeft, type StepProgress, type StoredJob, type TimeLeft } from '../../coordinator/index.ts';
import { $, h, seconds } from './dom.ts';

interface QueueLine {
  li: HTMLLIElement;
  bar: HTMLProgressElement;
  text: HTMLSpanElement;
  cancel: HTMLButtonElement;
  retry: HTMLButtonElement;
  dismiss: HTMLButtonElement;
}

const lines = new Map<number, QueueLine>();

/** What a person can do to a job from its line: stop it while it waits or runs; try it again or drop it once ended. */
export interface QueueActions {
  cancel(id: number): void;
  retry(id: number): void;
  dismiss(id: number): void;
}

export function renderQueue(jobs: StoredJob[], actions: QueueActions): void {
  const list = $('queue');
  const open = jobs.filter((j) => j.status !== 'done');
  for (const [id, line] of lines) {
    if (!open.some((j) => j.id === id)) {
      line.li.remove();
      lines.delete(id);
    }
  }
  for (const job of open) {
    let line = lines.get(job.id);
    if (!line) {
      const bar = h('progress', { max: job.params.steps, value: job.checkpoint?.step ?? 0 });
      bar.setAttribute('aria-label', `progress of job ${job.id}`);
      const text = h('span', { className: 'job-state' });
      const button = (action: keyof QueueActions, label: string) => {
        const b = h('button', {
          type: 'button',
          className: `job-${action}`,
          textContent: label,
          onclick: () => actions[action](job.id),
        });
        b.setAttribute('aria-label', `${action} job ${job.id}`);
        return b;
      };
      const [cancel, retry, dismiss] = [
        button('cancel', 'Cancel'),
        button('retry', 'Retry'),
        button('dismiss', 'Dismiss'),
      ];
      const li = h(
        'li',
        { dataset: { job: String(job.id) } },
        h('span', { className: 'job-prompt' }, `#${job.id} “${job.params.prompt}”`),
        bar,
        text,
        h('span', { className: 'job-actions' }, cancel, retry, dismiss),
      );
      line = { li, bar, text, cancel, retry, dismiss };
      lines.set(job.id, line);
      list.append(li);
    }
    line.li.dataset.status = job.status;
    const ended = job.status === 'failed' || job.status === 'cancelled';
    line.cancel.hidden = ended;
    line.retry.hidden = !ended;
    line.dismiss.hidden = !ended;
    if (job.checkpoint) line.bar.value = job.checkpoint.step;
    if (job.status !== 'running')
      line.text.textContent =
        job.status === 'failed'
          ? `failed: ${job.error ?? 'no reason given'}`
          : job.status === 'cancelled'
            ? 'cancelled'
            : job.checkpoint
              ? `waiting, ${job.checkpoint.step} steps done`
              : 'waiting';
  }
  $('queue-empty').hidden = open.length > 0;
}

export function showJobProgress(job: StoredJob, p: StepProgress): void {
  const line = lines.get(job.id);
  if (!line) return;
  line.bar.max = p.steps;
  line.bar.value = p.step;
  line.text.textContent = `step ${p.step}/${p.steps} · ${seconds(p.stepMs)} per step · ${seconds(p.etaMs)} left`;
}

export function showJobPhase(job: StoredJob, phase: string, detail: string | undefined, left: TimeLeft): void {
  const line = lines.get(job.id);
  if (line && phase !== 'denoising')
    line.text.textContent =
      `${phase === 'placing' ? 'placing on workers' : phase}…${detail ? ` ${detail}` : ''} · ` + describeLeft(left);
}
