// ditswarm/node-worker: a Node process as a worker of a swarm, computing natively (onnxruntime-node where it is
// installed), as `ditswarm worker LINK` (main.ts) runs it.
//
//   const { platform, compute } = await nodePlatform({ threads: 4 });
//   const worker = await startWorkerEndpoint({ origin: new URL(link).origin, token, platform,
//     onStatus: (s) => console.log(s.state, s.detail) });
export {
  nodeCompute,
  nodePlatform,
  type DeviceRequest,
  type NodeCompute,
  type NodePlatformOptions,
} from './platform.ts';
export {
  startWorkerEndpoint,
  type WorkerEndpoint,
  type WorkerEndpointOptions,
  type WorkerStatus,
} from '../endpoint.ts';
export { readWorkerLink } from '../../app/worker-link.ts';
