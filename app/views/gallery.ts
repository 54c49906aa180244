// Finished videos, newest first: play, download, and what made them.

import type { StoredJob } from '../../coordinator/index.ts';
import { $, h, seconds } from './dom.ts';

const urls = new Map<number, string>();

/** The job's video as a URL; null when the job asked for the latent only. */
export function videoUrl(job: StoredJob): string | null {
  const video = job.result?.video;
  if (!video) return null;
  let url = urls.get(job.id);
  if (url === undefined) urls.set(job.id, (url = URL.createObjectURL(video)));
  return url;
}

export function renderGallery(jobs: StoredJob[], play: (job: StoredJob) => void): void {
  const done = jobs.flatMap((job) => (job.status === 'done' && job.result ? [{ job, ...job.result }] : [])).reverse();
  $('gallery').replaceChildren(
    ...done.map(({ job, report }) => {
      const { params } = job;
      const playButton = h('button', { type: 'button', className: 'secondary' }, 'Play');
      playButton.addEventListener('click', () => play(job));
      const { backend } = report.config;
      // a report an older version kept has no placement: its ranks go unsaid
      const kept: Partial<Pick<typeof report, 'placement'>> = report;
      const workers = kept.placement?.layout.world;
      const details =
        `${params.frames} frames ${params.width}×${params.height}, ${params.steps} steps, ` +
        `guidance ${params.guidance}, seed ${params.seed} · ` +
        `${workers ?? 'some'} ${backend} rank${workers === 1 ? '' : 's'} · ${seconds(report.totalMs)}`;
      const url = videoUrl(job);
      return h(
        'li',
        { dataset: { job: String(job.id) } },
        h('strong', {}, `#${job.id} “${params.prompt}”`),
        h('span', { className: 'hint' }, details),
        url
          ? h(
              'span',
              { className: 'actions' },
              playButton,
              h('a', { href: url, download: `ditswarm-${job.id}.webm` }, 'Download WebM'),
            )
          : h('span', { className: 'hint' }, 'latent only (no video asked for)'),
      );
    }),
  );
}
