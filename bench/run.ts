// `npm run bench`: every benchmark, one after the other (they share the machine's cores, so
// never at once), each writing its own report under bench/out/, then the headline figures in
// bench/out/scaling.json.
//
//   npm run bench                      block cost, projection, local overhead, scaling, threads,
//                                      full-size, pooled, handoff, vae, uneven, slow-link, spot-check-overhead,
//                                      time-to-video, first-job, load, api-polls, node-worker, signaling, links
//                                      (in this order)
//   npm run bench -- scaling [flags]   one of them (flags as in bench/scaling.ts etc.)
//   npm run bench -- --smoke [name]    all of them (or one) at tiny sizes on small models, in a few minutes, without
//                                      waiting for a quiet machine, reports in bench/out/smoke/: what CI runs, so that
//                                      a change that breaks a benchmark fails there (the figures mean nothing)

import { parseOverheadArgs, runLocalOverhead, SMOKE_OVERHEAD } from './local-overhead.ts';
import { join } from 'node:path';
import { log, writeReport } from './lib.ts';
import { projectionMarkdown, runProjection } from './projection.ts';
import { parseScalingArgs, runScaling, SMOKE_SCALING } from './scaling.ts';
import { parseThreadsArgs, runThreads, SMOKE_THREADS } from './threads.ts';
import { parseFullSizeArgs, runFullSize, SMOKE_FULL_SIZE } from './full-size.ts';
import { parsePooledArgs, runPooled, SMOKE_POOLED } from './pooled.ts';
import { parseBlockCostArgs, runBlockCost, SMOKE_BLOCK_COST } from './block-cost.ts';
import { ensureSmokeVae, parseVaeArgs, runVae, SMOKE_VAE } from './vae.ts';
import { parseUnevenArgs, runUneven, SMOKE_UNEVEN } from './uneven.ts';
import { parseSlowLinkArgs, runSlowLink, SMOKE_SLOW_LINK } from './slow-link.ts';
import { parseSpotCheckOverheadArgs, runSpotCheckOverhead, SMOKE_SPOT_CHECK_OVERHEAD } from './spot-check-overhead.ts';
import { parseTimeToVideoArgs, runTimeToVideo, SMOKE_TIME_TO_VIDEO } from './time-to-video.ts';
import { parseLoadArgs, runLoad, SMOKE_LOAD } from './load.ts';
import { parseApiPollsArgs, runApiPolls, SMOKE_API_POLLS } from './api-polls.ts';
import { parseNodeWorkerArgs, runNodeWorker, SMOKE_NODE_WORKER } from './node-worker.ts';
import { parseSignalingArgs, runSignaling, SMOKE_SIGNALING } from './signaling.ts';
import { parseLinksArgs, runLinks, SMOKE_LINKS } from './links.ts';
import { parseHandOffArgs, runHandOff, SMOKE_HAND_OFF } from './handoff.ts';
import { parseFirstJobArgs, runFirstJob, SMOKE_FIRST_JOB } from './first-job.ts';
import { BENCHMARKS, type Benchmark } from './names.ts';

const smoke = process.argv.includes('--smoke');
const words = process.argv.slice(2).filter((a) => a !== '--smoke');
const first = words.at(0);
const rest = words.slice(1);
if (smoke && rest.length) {
  console.error(`bench: --smoke runs each benchmark at its own tiny sizes; it takes no flags (got ${rest.join(' ')})`);
  process.exit(1);
}
if (first !== undefined && !(BENCHMARKS as readonly string[]).includes(first)) {
  console.error(`bench: unknown benchmark "${first}"; run one of ${BENCHMARKS.join(', ')}, or none for all`);
  process.exit(1);
}
const chosen: Benchmark[] = first ? [first as Benchmark] : [...BENCHMARKS];
const args = first ? rest : [];
const started = Date.now();
/** how long each benchmark took, said at the end: a smoke section that takes minutes is a smoke run grown too big */
const took: string[] = [];
let sectionStarted = Date.now();
const sectionDone = (name: Benchmark) => {
  took.push(`${name} ${((Date.now() - sectionStarted) / 1000).toFixed(0)} s`);
  sectionStarted = Date.now();
};
/** Each benchmark's options: its smoke sizes, or its flags. */
const options = <T>(smokeSizes: T, parse: (args: string[]) => T): T => (smoke ? smokeSizes : parse(args));
const report = (name: string, body: unknown) => writeReport(smoke ? join('smoke', name) : name, body);
if (smoke) {
  // a smoke run measures nothing: it need not wait for other work on the machine to finish
  process.env.BENCH_QUIET_WAIT_S = '0';
}

// the projection is held to the block measured here: that comes first
let blockCost: Awaited<ReturnType<typeof runBlockCost>> | null = null;
if (chosen.includes('block-cost')) {
  blockCost = await runBlockCost(options(SMOKE_BLOCK_COST, parseBlockCostArgs));
  report('block-cost.json', blockCost);
  console.log(
    `block-cost: ${blockCost.config.tokens} tokens: ${blockCost.measured.blockMs} ms per block ` +
      `(predicted ${blockCost.predicted.blockMs}); a 480p step here ≈ ${blockCost.stepAt480pS} s`,
  );
  sectionDone('block-cost');
}

if (chosen.includes('projection')) {
  const projection = runProjection(blockCost ?? undefined);
  report('projection.json', projection);
  report('projection.md', projectionMarkdown(projection));
  sectionDone('projection');
}

let overhead: Awaited<ReturnType<typeof runLocalOverhead>> | null = null;
if (chosen.includes('local-overhead')) {
  overhead = await runLocalOverhead(options(SMOKE_OVERHEAD, parseOverheadArgs));
  report('local-overhead.json', overhead);
  sectionDone('local-overhead');
}

if (chosen.includes('scaling')) {
  const scaling = await runScaling(options(SMOKE_SCALING, parseScalingArgs));
  report('scaling.json', {
    ...scaling,
    localOverhead: overhead?.localOverhead ?? null,
    localOverheadDetail: overhead && {
      localStepMs: overhead.localStepMs,
      directForwardMs: overhead.directForwardMs,
      tokens: overhead.config.tokens,
      report: 'bench/out/local-overhead.json',
    },
  });
  const runs = Object.values(scaling.runs);
  console.log(
    '\n P | step ms | speed-up | compute ms | comm ms (of it peer wait) | idle ms | MB sent/rank | predicted ms | ' +
      'error | parity | load',
  );
  for (const r of runs) {
    const speedup = r.degree === 1 ? 1 : (scaling.speedup[String(r.degree)] ?? NaN);
    console.log(
      ` ${r.degree} | ${r.stepMs.toFixed(0)} | ${speedup.toFixed(2)}× | ${r.split.computeMs.toFixed(0)} | ` +
        `${r.split.commMs.toFixed(0)} (${r.split.peerWaitMs.toFixed(0)}) | ${r.split.idleMs.toFixed(0)} | ` +
        `${(r.split.bytesSent / 1e6).toFixed(1)} | ${r.predicted.stepMs.toFixed(0)} | ` +
        `${(100 * r.predictionError).toFixed(0)}% | ${r.parityMaxAbs.toExponential(1)} | ${r.loadAverage1m.start}`,
    );
  }
  console.log(
    `localOverhead ${overhead?.localOverhead ?? 'not run'}; ` +
      `fp16BytesRatio ${scaling.fp16BytesRatio}; fp16MaxAbs ${scaling.fp16MaxAbs}`,
  );
  sectionDone('scaling');
}
if (chosen.includes('threads')) {
  const threads = await runThreads(options(SMOKE_THREADS, parseThreadsArgs));
  report('threads.json', threads);
  console.log(
    `threads: alone ${threads.alone.threads} → ${threads.alone.stepMs} ms, ` +
      `beside another tab ${threads.beside.threads} → ${threads.beside.stepMs} ms: ${threads.speedup}×; ` +
      JSON.stringify(threads.meets),
  );
  sectionDone('threads');
}
if (chosen.includes('full-size')) {
  const fullSize = await runFullSize(options(SMOKE_FULL_SIZE, parseFullSizeArgs));
  report('full-size.json', fullSize);
  for (const r of fullSize.runs)
    console.log(
      `full-size: ${r.ranks} tab(s)${r.afterReload ? ' after reloading them' : ''}: placing ${r.placingMs} ms, ` +
        `steps ${r.stepsMs.join(', ')} ms, peak ${r.peakMemoryGiB.join(', ')} GiB; ` +
        `${r.relativeToOneTab} of one tab's latent; loads ${JSON.stringify(r.loads)}`,
    );
  sectionDone('full-size');
}
if (chosen.includes('pooled')) {
  const pooled = await runPooled(options(SMOKE_POOLED, parsePooledArgs));
  report('pooled.json', pooled);
  // each run's line was logged as it ended (runPooled): what it meets is left to say
  console.log(`pooled: ${JSON.stringify(pooled.meets)}`);
  sectionDone('pooled');
}
if (chosen.includes('handoff')) {
  const handOff = await runHandOff(options(SMOKE_HAND_OFF, parseHandOffArgs));
  report('handoff.json', handOff);
  for (const r of handOff.runs)
    console.log(
      `handoff: S = ${r.stages}: step ${r.stepMs} ms, compute ${r.computeMs.join(' / ')} ms, ` +
        `hand-offs ${r.handOffs.map((h) => `${h.bytes} B in ${h.ms} ms`).join(', ') || 'none'}, ` +
        `max-abs ${r.maxAbsFromOneTab}`,
    );
  sectionDone('handoff');
}
if (chosen.includes('vae')) {
  if (smoke) await ensureSmokeVae();
  const vae = await runVae(options(SMOKE_VAE, parseVaeArgs));
  report('vae.json', vae);
  if (vae.parity)
    for (const c of vae.parity.cases)
      console.log(
        `vae: latent [${c.latent.join(',')}]: max |onnx − reference| ${c.maxAbs.toExponential(2)} ` +
          `(${c.within ? 'within' : 'OVER'} ${vae.parity.bound})`,
      );
  const t = vae.tile;
  if (t)
    console.log(
      `vae: a 256-px tile, ${t.perVideoFrameMs} ms per frame on one tab, ` +
        `caches ${(t.cacheBytes / 2 ** 20).toFixed(0)} MiB, weights ${(t.weightBytes / 2 ** 20).toFixed(0)} MiB; ` +
        `480p × 81 frames ≈ ${t.projected480p81FramesOneTabS} s on one tab`,
    );
  sectionDone('vae');
}
if (chosen.includes('uneven')) {
  const uneven = await runUneven(options(SMOKE_UNEVEN, parseUnevenArgs));
  report('uneven.json', uneven);
  const { even, bySpeed, auto } = uneven.runs;
  console.log(
    `uneven: the third tab ${uneven.measuredSlowdown}× slower; even shares ${even.stepMs} ms a step, ` +
      `by speed (${bySpeed.heads?.join('/') ?? 'even'}) ${bySpeed.stepMs} ms: ${uneven.gain}×; ` +
      `auto chose ${auto.degree} (${auto.heads?.join('/') ?? 'even'}); ` +
      `spot checks ${JSON.stringify(uneven.spotCheckCost)}; ${JSON.stringify(uneven.meets)}`,
  );
  sectionDone('uneven');
}
if (chosen.includes('slow-link')) {
  const slowLink = await runSlowLink(options(SMOKE_SLOW_LINK, parseSlowLinkArgs));
  report('slow-link.json', slowLink);
  console.log(
    `slow-link: emulated ${(slowLink.emulateLink.bandwidth / 1e6).toFixed(2)} MB/s, ` +
      `${slowLink.emulateLink.latencyMs} ms: exchange/compute at P = 2 ${slowLink.emulatedRatio.measured} ` +
      `(target ${slowLink.emulatedRatio.target}); ${JSON.stringify(slowLink.runs)}; ` +
      `guided ${JSON.stringify(slowLink.guided)}; ${JSON.stringify(slowLink.meets)}`,
  );
  sectionDone('slow-link');
}
if (chosen.includes('spot-check-overhead')) {
  const spot = await runSpotCheckOverhead(options(SMOKE_SPOT_CHECK_OVERHEAD, parseSpotCheckOverheadArgs));
  report('spot-check-overhead.json', spot);
  console.log(
    `spot-check-overhead: P = ${spot.config.workers}, rate ${spot.config.rates[1]}: ` +
      `denoising +${(100 * spot.overhead.denoising).toFixed(1)} %, ` +
      `median step +${(100 * spot.overhead.medianStep).toFixed(1)} %, ${spot.on.checksPerJob} checks a job`,
  );
  sectionDone('spot-check-overhead');
}
if (chosen.includes('time-to-video')) {
  const ttv = await runTimeToVideo(options(SMOKE_TIME_TO_VIDEO, parseTimeToVideoArgs));
  report('time-to-video.json', ttv);
  for (const r of ttv.runs)
    console.log(
      `time-to-video: ${r.name}: ${r.forwardsComputed} forwards (${r.fewerForwards}× fewer), ` +
        `denoising ${r.denoisingMs} ms (${r.speedup}×), latent max-abs ${r.latentMaxAbs}, PSNR ${r.videoPsnrDb} dB`,
    );
  sectionDone('time-to-video');
}
if (chosen.includes('first-job')) {
  const firstJob = await runFirstJob(options(SMOKE_FIRST_JOB, parseFirstJobArgs));
  report('first-job.json', firstJob);
  console.log(
    `first-job: Enter to video ${firstJob.first.enterToVideoMs} ms for the first job on fresh tabs, ` +
      `${firstJob.second.enterToVideoMs} ms for the second (${firstJob.firstOverSecond}×)`,
  );
  sectionDone('first-job');
}

if (chosen.includes('load')) {
  const load = await runLoad(options(SMOKE_LOAD, parseLoadArgs));
  report('load.json', load);
  const rates = (run: typeof load.fromServer) => run.tabs.map((t) => `${t.readMBs} MB/s`).join(', ');
  console.log(
    `load: from the server ${rates(load.fromServer)} (all in ${load.fromServer.allLoadedS} s); ` +
      `from the cache ${rates(load.fromCache)} (all in ${load.fromCache.allLoadedS} s); ${JSON.stringify(load.meets)}`,
  );
  sectionDone('load');
}

if (chosen.includes('api-polls')) {
  const polls = await runApiPolls(options(SMOKE_API_POLLS, parseApiPollsArgs));
  report('api-polls.json', polls);
  console.log(
    `api-polls: ${polls.config.clients} clients, the median step over the job's without polls: ` +
      Object.entries(polls.stepRatio)
        .map(([load, ratio]) => `${load} ${ratio}`)
        .join(', '),
  );
  sectionDone('api-polls');
}

if (chosen.includes('node-worker')) {
  const nodeWorker = await runNodeWorker(options(SMOKE_NODE_WORKER, parseNodeWorkerArgs));
  report('node-worker.json', nodeWorker);
  console.log(
    `node-worker: a step on one tab ${nodeWorker.tab.stepMs} ms, on one process ${nodeWorker.node.stepMs} ms ` +
      `(${nodeWorker.nativeSpeedup}× on ${nodeWorker.config.cores} cores); the job on two processes ` +
      `${nodeWorker.twoNodes.totalMs} ms`,
  );
  sectionDone('node-worker');
}
if (chosen.includes('signaling')) {
  const signaling = await runSignaling(options(SMOKE_SIGNALING, parseSignalingArgs));
  report('signaling.json', signaling);
  const { perWorker } = signaling.server;
  console.log(
    `signaling: ${signaling.joined} of ${signaling.config.workers} workers joined ` +
      `(${signaling.config.addresses} addresses), ${signaling.joinsPerSecond} a second, ` +
      `join p50/p95 ${signaling.joinMs.p50}/${signaling.joinMs.p95} ms (the server's part ` +
      `${signaling.serverPartMs.p50}/${signaling.serverPartMs.p95} ms); ` +
      `the server ${signaling.server.idle.rssMiB} MiB ` +
      `idle, ${perWorker.rssKiB} KiB and ${perWorker.joinCpuMs} ms CPU a worker; ` +
      `refused ${signaling.refused.reduce((n, r) => n + r.count, 0)}` +
      (signaling.dashboardCut ? `; the dashboard's signaling socket was cut (${signaling.dashboardCut.code})` : ''),
  );
  sectionDone('signaling');
}
if (chosen.includes('links')) {
  const links = await runLinks(options(SMOKE_LINKS, parseLinksArgs));
  report('links.json', links);
  for (const [path, r] of Object.entries(links.paths))
    console.log(
      `links: ${path}: hand-off (${r.handOff.transport}) ${r.handOff.oneWayMBs} MB/s one way, ` +
        `${r.handOff.bothWaysMBs} MB/s each way both at once; P = 2 step ${r.job.stepMs} ms ` +
        `(links ${r.job.links.join(', ')}; latent ${r.job.maxAbsVsDirect} off the direct run's)`,
    );
  sectionDone('links');
}
log(`done in ${((Date.now() - started) / 1000).toFixed(0)} s: ${took.join(', ')}`);
