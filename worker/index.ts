// ditswarm/worker: what a page needs to become a worker of a swarm, as the bundled worker page (app/worker-page.ts)
// does.
//
//   const { token } = readWorkerLink(link, null);           // the link the dashboard shows (…/worker.html#token=…)
//   const worker = await startWorkerEndpoint({ origin: new URL(link).origin, token, platform: tabPlatform,
//     onStatus: (s) => console.log(s.state, s.detail) });
//   worker.leave();
export { startWorkerEndpoint, type WorkerEndpoint, type WorkerEndpointOptions, type WorkerStatus } from './endpoint.ts';
export { tabPlatform } from './tab.ts';
export type { WorkerPlatform } from './platform.ts';
export { readWorkerLink } from '../app/worker-link.ts';
