// Finished videos, newest first: play, download, and what made them.

import type { StoredJob } from '../../coordinator/index.ts';
import { $, h, seconds } from './dom.ts';

const urls = new Map<number, string>();

/** The job's video as a URL; null when the job asked for the latent only. */
export function videoUrl(job: StoredJob): string | null {
  const video = job.result?.video;
  if (!video) return null;
  if (!urls.has(job.id)) urls.set(job.id, URL.createObjectURL(video));
  return urls.get(job.id)!;
}

export function renderGallery(jobs: StoredJob[], play: (job: StoredJob) => void): void {
  const done = jobs.filter((j) => j.status === 'done' && j.result).reverse();
  $('gallery').replaceChildren(
    ...done.map((job) => {
      const { params } = job;
      const report = job.result!.report;
      const playButton = h('button', { type: 'button', className: 'secondary' }, 'Play');
      playButton.addEventListener('click', () => play(job));
      const details = `${params.frames} frames ${params.width}×${params.height}, ${params.steps} steps, guidance ${params.guidance}, seed ${params.seed} · ${report.config.workers} ${report.config.backend} rank${report.config.workers === 1 ? '' : 's'} · ${seconds(report.totalMs)}`;
      return h(
        'li',
        { dataset: { job: String(job.id) } },
        h('strong', {}, `#${job.id} “${params.prompt}”`),
        h('span', { className: 'hint' }, details),
        videoUrl(job)
          ? h(
              'span',
              { className: 'actions' },
              playButton,
              h('a', { href: videoUrl(job)!, download: `ditswarm-${job.id}.webm` }, 'Download WebM'),
            )
          : h('span', { className: 'hint' }, 'latent only (no video asked for)'),
      );
    }),
  );
}
