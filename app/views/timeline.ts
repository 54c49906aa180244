// The per-step timeline: for the last steps, one lane per rank with its compute (blue), its
// waiting for peers (orange) and the rest of the step (grey: coordinator, scheduling, idle). An
// orange band along the bottom of the compute is the part of it an exchange of the rank's was on
// the wire meanwhile: the exchange hidden behind compute (head groups, displaced mode's gather).

import type { RankReport } from '../../coordinator/index.ts';
import { defined } from '../../core/defined.ts';

const COLORS = { compute: '#2454d6', comm: '#f08c00', idle: '#d0d5dd' };
const MAX_STEPS = 12;
/** px: the band of the compute under which an exchange was on the wire */
const HIDDEN_BAND = 4;
const steps: { ms: number; ranks: RankReport[] }[] = [];

export function resetTimeline(): void {
  steps.length = 0;
  draw();
}

export function addTimelineStep(ms: number, ranks: RankReport[]): void {
  steps.push({ ms, ranks });
  if (steps.length > MAX_STEPS) steps.shift();
  draw();
}

function draw(): void {
  const canvas = document.getElementById('timeline') as HTMLCanvasElement | null;
  if (!canvas) return;
  const ratio = devicePixelRatio || 1;
  const width = canvas.clientWidth || 480;
  const lanes = Math.max(1, ...steps.map((s) => s.ranks.length));
  const laneHeight = 14;
  const height = 24 + lanes * (laneHeight + 4);
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.height = `${height}px`;
  const g = defined(canvas.getContext('2d'), "the timeline's 2D context");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  g.font = '11px system-ui, sans-serif';
  g.fillStyle = '#5b6472';
  if (!steps.length) {
    g.fillText('Per-step timeline appears here while a job runs.', 4, 14);
    return;
  }
  const label = 44;
  const total = steps.reduce((t, s) => t + s.ms, 0);
  const scale = (width - label - 4) / total;
  for (let r = 0; r < lanes; r++) g.fillText(`rank ${r}`, 0, 24 + r * (laneHeight + 4) + 11);
  let x = label;
  for (const step of steps) {
    const w = step.ms * scale;
    step.ranks.forEach((rank, r) => {
      const y = 24 + r * (laneHeight + 4);
      const compute = Math.min(rank.computeMs, step.ms) * scale;
      const comm = Math.min(rank.commMs, step.ms - rank.computeMs) * scale;
      g.fillStyle = COLORS.idle;
      g.fillRect(x, y, Math.max(w - 1, 1), laneHeight);
      g.fillStyle = COLORS.compute;
      g.fillRect(x, y, compute, laneHeight);
      g.fillStyle = COLORS.comm;
      g.fillRect(x + compute, y, Math.max(comm, 0), laneHeight);
      const hidden = Math.min(rank.overlapMs, rank.computeMs, step.ms) * scale;
      g.fillRect(x, y + laneHeight - HIDDEN_BAND, hidden, HIDDEN_BAND);
    });
    x += w;
  }
  g.fillStyle = '#5b6472';
  g.fillText(`last ${steps.length} step${steps.length === 1 ? '' : 's'}: ${(total / 1000).toFixed(1)} s`, label, 12);
}
