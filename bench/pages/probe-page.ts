import * as ort from 'onnxruntime-web';
import { Peer } from 'peerjs';
import type { DataConnectionLike, Transport } from '../../core/net/channel.ts';
import {
  connectRelay,
  dial,
  newPeerId,
  openLink as openPeerLink,
  peerOptions,
  registerPeer,
  signalingOptions,
} from '../../core/net/peer-link.ts';
import type { RelayRole } from '../../core/net/relay-client.ts';
import { askTurn, linkTransport, turnSignaling, workerIceRequest } from '../../core/net/turn.ts';
import { fetchModelFiles, readJson } from '../../core/model/files.ts';
import type { WanModel } from '../../core/model/reference.ts';
import { loadTransformer } from '../../core/model/transformer.ts';
import { Link } from '../../core/net/link.ts';
import { SeededRandom } from '../../core/random.ts';
import { memoryExchanges } from '../../rank/exchange/memory.ts';
import { onnxStages } from '../../rank/onnx-stages.ts';
import { probeThroughput } from '../../rank/throughput-probe.ts';
import type { StageRunner } from '../../rank/stages.ts';
import { forwardInProcess } from '../../rank/ulysses.ts';
import { defined } from '../../core/defined.ts';

// What the benchmarks measure inside Chromium without the app around it: matmul throughput,
// the tab↔tab data-channel link (through the app's own Link framing), the same link as the app's
// pages open it through a ditswarm server (PeerJS, TURN, the relay: whichever the server's settings
// give), and a forward pass on the same ONNX sessions the engine builds, called directly.
ort.env.wasm.numThreads = 1;

let peer: RTCPeerConnection | null = null;
let link: Link | null = null;
let received = 0;
/**
 * the bytes this page's transfers asked for so far: a transfer waits for the count to reach its own
 * share, so bytes the peer sent before this page asked for them (its evaluate ran first) still count
 */
let expected = 0;
let waiters: { bytes: number; resolve: () => void }[] = [];

/** Makes `opened` the probe link: the bytes of its tensors are counted as they arrive. */
function useLink(opened: Link): void {
  link = opened;
  [received, expected, waiters] = [0, 0, []];
  opened.onMessage((msg) => {
    if (msg.kind !== 'tensor') return;
    received += msg.data.byteLength;
    waiters = waiters.filter((w) => (received >= w.bytes ? (w.resolve(), false) : true));
  });
}

function openLink(channel: RTCDataChannel): Promise<void> {
  channel.binaryType = 'arraybuffer';
  return new Promise((resolve) => {
    const ready = () => {
      useLink(new Link(channel));
      channel.addEventListener('message', (e) => defined(link, 'the probe link').receive(e.data as ArrayBuffer));
      resolve();
    };
    if (channel.readyState === 'open') ready();
    else channel.addEventListener('open', ready, { once: true });
  });
}

/**
 * The description with every host candidate: the probe trickles nothing, so a description sent before gathering
 * completed (a loaded machine gathers slowly) may carry no candidate, and its link never opens.
 */
async function gathered(pc: RTCPeerConnection): Promise<RTCSessionDescriptionInit> {
  await new Promise<void>((r) => {
    if (pc.iceGatheringState === 'complete') r();
    pc.addEventListener('icegatheringstatechange', () => pc.iceGatheringState === 'complete' && r());
  });
  return defined(pc.localDescription, 'the local description just set').toJSON();
}

/** This page as a page of a swarm: its PeerJS peer on a ditswarm server, and how it dials (peerJoin) */
let member: { peer: Peer; dial: (to: string) => Promise<DataConnectionLike> } | null = null;
/** how the probe link of peerDial or peerAccepted goes, once open */
let memberTransport: Transport | null = null;

let direct: { model: WanModel; stages: StageRunner; text: Float32Array } | null = null;

/** Time spent in each kind of stage call, summed over blocks (reset per forward). */
const stageMs: Record<keyof StageRunner, number> = {
  embed: 0,
  preAttention: 0,
  attention: 0,
  postAttention: 0,
  head: 0,
};
function timedStages(stages: StageRunner): StageRunner {
  const timed = <K extends keyof StageRunner>(kind: K) =>
    (async (...args: unknown[]) => {
      const start = performance.now();
      try {
        return await (stages[kind] as (...a: unknown[]) => Promise<unknown>)(...args);
      } finally {
        stageMs[kind] += performance.now() - start;
      }
    }) as StageRunner[K];
  return {
    embed: timed('embed'),
    preAttention: timed('preAttention'),
    attention: timed('attention'),
    postAttention: timed('postAttention'),
    head: timed('head'),
  };
}

const bench = {
  throughput: (ep: 'wasm' | 'webgpu', size: number, runs: number) => probeThroughput(ep, { size, runs }),

  async linkOffer(): Promise<RTCSessionDescriptionInit> {
    peer = new RTCPeerConnection();
    const opened = openLink(peer.createDataChannel('probe', { ordered: true }));
    await peer.setLocalDescription(await peer.createOffer());
    void opened;
    return gathered(peer);
  },
  async linkAnswer(offer: RTCSessionDescriptionInit): Promise<RTCSessionDescriptionInit> {
    peer = new RTCPeerConnection();
    const pc = peer;
    const opened = new Promise<void>((r) =>
      pc.addEventListener('datachannel', (e) => void openLink(e.channel).then(r), { once: true }),
    );
    await peer.setRemoteDescription(offer);
    await peer.setLocalDescription(await peer.createAnswer());
    void opened;
    return gathered(peer);
  },
  async linkAccept(answer: RTCSessionDescriptionInit): Promise<void> {
    await defined(peer, 'the peer connection of linkOffer').setRemoteDescription(answer);
  },
  async linkReady(): Promise<void> {
    while (!link) await new Promise((r) => setTimeout(r, 20));
  },
  /** Sends `bytes` (one message) and waits until as many bytes came from the peer; seconds. */
  async linkExchange(bytes: number): Promise<number> {
    const target = (expected += bytes);
    const start = performance.now();
    const arrived = new Promise<void>((resolve) =>
      received >= target ? resolve() : waiters.push({ bytes: target, resolve }),
    );
    const data = new Uint8Array(bytes);
    await defined(link, 'the probe link: linkReady first').send({
      kind: 'tensor',
      from: 0,
      tag: { job: 0, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
      dtype: 'f32',
      shape: [bytes / 4],
      data,
    });
    await arrived;
    return (performance.now() - start) / 1000;
  },
  /** One way only: sends `bytes` and resolves once they are handed to the channel. */
  async linkSend(bytes: number): Promise<void> {
    await defined(link, 'the probe link: linkReady first').send({
      kind: 'tensor',
      from: 0,
      tag: { job: 0, step: 0, pass: 0, block: 0, phase: 0, group: 0 },
      dtype: 'f32',
      shape: [bytes / 4],
      data: new Uint8Array(bytes),
    });
  },
  /** Waits until `bytes` more arrived from the peer; seconds. */
  async linkReceive(bytes: number): Promise<number> {
    const target = (expected += bytes);
    const start = performance.now();
    await new Promise<void>((resolve) => (received >= target ? resolve() : waiters.push({ bytes: target, resolve })));
    return (performance.now() - start) / 1000;
  },
  linkClose(): void {
    [received, expected] = [0, 0];
    link?.close('probe done');
    peer?.close();
    member?.peer.destroy();
  },

  /**
   * Joins the server at `origin` as a swarm's page holding `token` does: a PeerJS peer with the
   * server's ICE settings (TURN credentials where it gives them), its relay socket where the relay is
   * on (the relay lets a worker in only beside its room's coordinator: the accepting side is one).
   * Takes the first connection another page opens to it as the probe link. Returns its id.
   */
  async peerJoin(origin: string, token: string, role: RelayRole): Promise<string> {
    const signaling = await signalingOptions(origin);
    const id = newPeerId(role);
    const turn = await turnSignaling(signaling, () => askTurn(origin, workerIceRequest(token, id)));
    // eslint-disable-next-line @typescript-eslint/no-unsafe-class-instance-assignment -- a plain object
    const joined = await registerPeer(() => new Peer(id, peerOptions(turn.signaling)), origin);
    const accept = (conn: DataConnectionLike) =>
      void openPeerLink(conn, () => {}).then(async (opened) => {
        useLink(opened);
        memberTransport = await linkTransport(conn);
      });
    joined.on('connection', (conn) => accept(conn as unknown as DataConnectionLike));
    const relay =
      signaling.relay.mode === 'off'
        ? null
        : await connectRelay(origin, signaling, { peer: id, auth: joined.options.token ?? '', token, role });
    relay?.onConnection(accept);
    member = {
      peer: joined,
      dial: (to) =>
        dial(
          joined,
          to,
          { role: 'probe' },
          {
            mode: signaling.relay.mode,
            client: () => Promise.resolve(defined(relay, 'the relay socket (the server has it off)')),
          },
        ),
    };
    return id;
  },
  /** Opens the probe link to the page `to` (which joined too); how it goes: direct, TURN or the relay. */
  async peerDial(to: string): Promise<Transport> {
    const conn = await defined(member, 'this page in the swarm: peerJoin first').dial(to);
    useLink(await openPeerLink(conn, () => {}));
    return (memberTransport = await linkTransport(conn));
  },
  /** How the probe link another page opened to this one goes, once it is open. */
  async peerAccepted(): Promise<Transport> {
    while (!memberTransport) await new Promise((r) => setTimeout(r, 20));
    return memberTransport;
  },

  /** Builds the engine's ONNX sessions for a model, here in the page: no executor, no RPC. */
  async directLoad(modelUrl: string): Promise<{ loadMs: number }> {
    const started = performance.now();
    const files = fetchModelFiles(modelUrl);
    const model = await loadTransformer(files);
    const { max_length: textLength } = (await readJson(files, 'text_encoder/config.json')) as { max_length: number };
    direct = {
      model,
      stages: timedStages(await onnxStages(model, 'wasm')),
      text: new SeededRandom(1).normals(textLength * model.config.textDim),
    };
    return { loadMs: performance.now() - started };
  },
  /** One forward pass on those sessions; its time and where it went by stage kind. */
  async directForward(
    latentShape: number[],
    timestep: number,
  ): Promise<{ ms: number; stageMs: Record<keyof StageRunner, number> }> {
    if (!direct) throw new Error('directLoad first');
    for (const k of Object.keys(stageMs)) stageMs[k as keyof StageRunner] = 0;
    const latent = { shape: latentShape, data: new SeededRandom(2).normals(latentShape.reduce((a, b) => a * b, 1)) };
    const start = performance.now();
    await forwardInProcess(direct.model.config, direct.stages, memoryExchanges(1), latent, timestep, direct.text);
    return { ms: performance.now() - start, stageMs: { ...stageMs } };
  },
};

(window as unknown as { bench: typeof bench }).bench = bench;
