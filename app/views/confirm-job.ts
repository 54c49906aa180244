// Asking a person before a long job is queued. Not window.confirm(): the dashboard's page is the coordinator, and a
// modal dialog stops its main thread (heartbeats, a running job's steps) until it is answered.
import { $, h } from './dom.ts';

/** the question on show, answered "no" when another replaces it */
let shown: ((queue: boolean) => void) | null = null;

/** Shows `question` under the status line with two buttons; whether the person chose to queue the job. */
export function confirmJob(question: string): Promise<boolean> {
  shown?.(false);
  return new Promise((answer) => {
    const done = (queue: boolean) => {
      box.remove();
      shown = null;
      answer(queue);
    };
    const no = h('button', { type: 'button', onclick: () => done(false) }, 'Do not queue it');
    const box = h(
      'div',
      { id: 'confirm-job', role: 'alertdialog' },
      h('p', {}, question),
      h('button', { type: 'button', onclick: () => done(true) }, 'Queue it anyway'),
      no,
    );
    shown = done;
    $('status').after(box);
    no.focus();
  });
}
