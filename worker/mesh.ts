// A worker page's links to the other ranks of its job: the higher rank dials each lower one (a data
// channel, or the relay), connections from other ranks are matched to the ranks the coordinator
// named, and every frame a rank sends is judged by its header before a byte of it is buffered.
import type { DataConnectionLike, Transport } from '../core/net/channel.ts';
import type { Link } from '../core/net/link.ts';
import {
  dial,
  DIRECT_OPEN_TIMEOUT_MS,
  openLink,
  type OpenLinkOptions,
  type PeerDialer,
  type RelayMode,
} from '../core/net/peer-link.ts';
import { SIGNATURE_BYTES, type DType, type FrameHeader } from '../core/net/protocol.ts';
import type { RelayClient } from '../core/net/relay-client.ts';
import { PeerLost, type HandOffMesh, type InitArgs } from '../core/worker-api.ts';
import { handOffDType, type MeshKind } from '../rank/hand-off.ts';
import { MeshExchange } from '../rank/exchange/mesh.ts';
import { EmulatedWire } from '../core/net/paced-channel.ts';
import { linkTransport } from '../core/net/turn.ts';

const MESH_TIMEOUT_MS = 30_000;
/** Connections of one rank kept until this rank asks for them (a data channel, then maybe a relayed one). */
const MAX_EARLY_CANDIDATES = 4;
/** early connections of all sessions held at once */
const MAX_HELD_CANDIDATES = 16;
/** how long an early connection waits for its rank's initWorker: the coordinator sends them together */
export const EARLY_CANDIDATE_MS = 10_000;

/**
 * Judges a tensor by its sender's rank, its tag and size (the runtime's judgeTensor), on the rank's mesh or one of its
 * hand-off links (StageLinks): why it is refused, or null.
 */
export type TensorJudge = (from: number, tag: FrameHeader['tag'], totalBytes: number, link: MeshKind) => string | null;

/**
 * What rank `rank` may send this one on the mesh: only tensors, only in its own name, only of the
 * mesh's dtype, only of the running job at the planned size. Returns why a frame is refused, and
 * whether that refusal makes the rank a misbehaving one (speaking in another rank's name) rather
 * than a bad frame to drop.
 */
export function judgeMeshFrame(
  rank: number,
  header: FrameHeader,
  judge: (from: number, tag: FrameHeader['tag'], totalBytes: number) => string | null,
  dtype: DType,
): { refused: string; misbehaved: boolean } | null {
  if (header.kind !== 'tensor')
    return { refused: `rank ${rank} sent a ${header.kind} message on the mesh`, misbehaved: false };
  if (header.from !== rank) return { refused: `it sent a tensor in the name of rank ${header.from}`, misbehaved: true };
  if (header.dtype !== dtype) return { refused: `a ${header.dtype} tensor on a ${dtype} mesh`, misbehaved: false };
  // the signature's bytes are the ledger's to judge (exchange/ledger.ts), the payload's the plan's
  const refused = judge(rank, header.tag, header.totalBytes - (header.signed ? SIGNATURE_BYTES : 0));
  return refused === null ? null : { refused, misbehaved: false };
}

/** One mesh of a rank's job: its exchange, and how each of its links goes. */
interface LinkedMesh {
  exchange: MeshExchange;
  links: Map<number, { peer: string; transport: Transport }>;
}

export class WorkerMesh {
  /** connections from other ranks that came before this rank's initWorker, by session/rank */
  private readonly candidates = new Map<string, DataConnectionLike[]>();
  private readonly waiters = new Map<string, (conn: DataConnectionLike) => void>();
  /** this rank's job: its stage's mesh, then its hand-off links' (connectStages), and every connection of them */
  private current: {
    meshes: LinkedMesh[];
    connections: DataConnectionLike[];
    /** one emulated uplink for all of this rank's links, where the job asks for one */
    wire: EmulatedWire | undefined;
  } | null = null;

  constructor(
    private readonly peer: PeerDialer,
    private readonly relayMode: RelayMode,
    private readonly relayClient: () => Promise<RelayClient>,
    private readonly judge: TensorJudge,
  ) {}

  /** bad frames dropped on the links to the other ranks */
  framesDropped(): number {
    return this.current?.meshes.reduce((n, m) => n + m.exchange.framesDropped(), 0) ?? 0;
  }

  /** the open links to the other ranks: which peer, and how each goes (direct, TURN or the relay) */
  links(): { peer: string; transport: Transport }[] {
    return this.current?.meshes.flatMap((m) => [...m.links.values()]) ?? [];
  }

  /** A connection another page opened to this one: kept for its rank, or closed if it is not a rank's. */
  incoming(conn: DataConnectionLike): void {
    const meta = conn.metadata as { role?: string; session?: string; rank?: number } | undefined;
    if (meta?.role !== 'rank' || typeof meta.session !== 'string' || !Number.isInteger(meta.rank)) {
      conn.close();
      return;
    }
    const key = `${meta.session}/${meta.rank}`;
    const waiter = this.waiters.get(key);
    if (waiter) {
      waiter(conn);
      return;
    }
    // a connection for a mesh this rank is not (yet) in: kept a little while for its initWorker,
    // a few at a time, as a page that names any session it likes could otherwise keep any number
    const early = this.candidates.get(key) ?? [];
    const held = [...this.candidates.values()].reduce((n, list) => n + list.length, 0);
    if (early.length >= MAX_EARLY_CANDIDATES || held >= MAX_HELD_CANDIDATES) {
      conn.close();
      return;
    }
    this.candidates.set(key, [...early, conn]);
    setTimeout(() => {
      const still = this.candidates.get(key);
      if (!still?.includes(conn)) return; // taken by its mesh
      const rest = still.filter((c) => c !== conn);
      if (rest.length) this.candidates.set(key, rest);
      else this.candidates.delete(key);
      conn.close();
    }, EARLY_CANDIDATE_MS);
  }

  close(reason = 'job mesh closed'): void {
    const job = this.current;
    this.current = null;
    for (const { exchange } of job?.meshes ?? []) {
      exchange.fail(new Error(reason));
      exchange.closeLinks(reason);
    }
    job?.connections.forEach((c) => c.close());
  }

  /** Links this rank to every other rank of `init`'s mesh; replaces any earlier mesh. */
  async connect(init: InitArgs): Promise<MeshExchange> {
    this.close('a new job mesh replaced it');
    const job = (this.current = {
      meshes: [] as LinkedMesh[],
      connections: [] as DataConnectionLike[],
      wire: init.emulateLink ? new EmulatedWire(init.emulateLink) : undefined,
    });
    return this.linkMesh(job, init, init.dtype, 'mesh');
  }

  /**
   * Links this rank to its hand-off partners in the stages before and after (init.stageLinks), after connect: each a
   * mesh of two of the dtype a hand-off travels in.
   */
  async connectStages(init: InitArgs): Promise<{ before?: MeshExchange; after?: MeshExchange }> {
    const job = this.current;
    if (!job) throw new Error("connectStages before connect: a rank's stage links are of its job");
    const { before, after } = init.stageLinks ?? {};
    const dtype = handOffDType(init.dtype);
    const [from, to] = await Promise.all([
      before && this.linkMesh(job, before, dtype, 'before'),
      after && this.linkMesh(job, after, dtype, 'after'),
    ]);
    return { ...(from && { before: from }), ...(to && { after: to }) };
  }

  /** Links this rank to every other rank of `mesh`, as one more mesh of `job`. */
  private async linkMesh(
    job: NonNullable<WorkerMesh['current']>,
    mesh: HandOffMesh,
    dtype: DType,
    kind: MeshKind,
  ): Promise<MeshExchange> {
    const exchange = new MeshExchange(mesh.rank, mesh.world, dtype);
    const linked: LinkedMesh = { exchange, links: new Map() };
    job.meshes.push(linked);
    const judge = (from: number, tag: FrameHeader['tag'], bytes: number) => this.judge(from, tag, bytes, kind);
    const linkTo = async (rank: number): Promise<void> => {
      const linkOptions = (conn: DataConnectionLike): OpenLinkOptions => ({
        emulate: job.wire,
        accept: (header) => {
          const verdict = judgeMeshFrame(rank, header, judge, exchange.dtype);
          if (verdict?.misbehaved) {
            exchange.fail(new PeerLost({ rank, cause: 'misbehaved', evidence: `${verdict.refused}; disconnected` }));
            conn.close();
          }
          return verdict?.refused ?? null;
        },
      });
      const onLost = (reason: string) => exchange.fail(new PeerLost({ rank, cause: 'disconnected', evidence: reason }));
      let opened: { conn: DataConnectionLike; link: Link };
      if (rank < mesh.rank) {
        // the higher rank dials, so each pair connects once
        const conn = await dial(
          this.peer,
          mesh.peers[rank],
          { role: 'rank', session: mesh.session, rank: mesh.rank },
          { mode: this.relayMode, client: this.relayClient },
        );
        job.connections.push(conn);
        if (this.current !== job) throw new Error(`the mesh for rank ${rank} was replaced while connecting`);
        opened = { conn, link: await openLink(conn, onLost, linkOptions(conn)) };
      } else {
        opened = await this.accept(mesh, rank, job.connections, linkOptions, onLost);
      }
      exchange.addPeer(rank, opened.link);
      linked.links.set(rank, { peer: opened.conn.peer, transport: await linkTransport(opened.conn) });
    };
    await Promise.all(mesh.peers.map((_, rank) => (rank === mesh.rank ? Promise.resolve() : linkTo(rank))));
    return exchange;
  }

  /**
   * The connection rank `rank` opened to this one, as a Link: the first of its connections to
   * open wins (its data channel, or after RELAY_FALLBACK_MS its relayed one); later ones close.
   */
  private accept(
    init: HandOffMesh,
    rank: number,
    connections: DataConnectionLike[],
    linkOptions: (conn: DataConnectionLike) => OpenLinkOptions,
    onLost: (reason: string) => void,
  ) {
    const key = `${init.session}/${rank}`;
    return new Promise<{ conn: DataConnectionLike; link: Link }>((resolve, reject) => {
      let settled = false;
      const finish = () => {
        settled = true;
        clearTimeout(timer);
        if (this.waiters.get(key) === consider) this.waiters.delete(key);
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`rank ${rank} did not connect to rank ${init.rank} within ${MESH_TIMEOUT_MS / 1000} s`));
      }, MESH_TIMEOUT_MS);
      const consider = (conn: DataConnectionLike) => {
        if (settled) {
          conn.close();
          return;
        }
        // the signaling server (and the relay, by the same credential) vouches for peer ids: only the
        // peer the coordinator named may be rank r. An impostor is turned away; the real rank may still come.
        if (conn.peer !== init.peers[rank]) {
          conn.close();
          return;
        }
        connections.push(conn);
        let chosen = false;
        const opening = openLink(conn, (reason) => chosen && onLost(reason), {
          ...linkOptions(conn),
          openTimeoutMs: conn.open ? undefined : DIRECT_OPEN_TIMEOUT_MS,
        });
        opening.then(
          (link) => {
            if (settled) {
              link.close('another connection of the same rank opened first');
              conn.close();
              return;
            }
            chosen = true;
            finish();
            resolve({ conn, link });
          },
          () => {}, // a data channel that never opened: that rank dials again through the relay
        );
      };
      const early = this.candidates.get(key) ?? [];
      this.candidates.delete(key);
      this.waiters.set(key, consider);
      early.forEach(consider);
    });
  }
}
