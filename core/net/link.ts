// One data channel to one peer, as a stream of whole messages each way.
//
// Sending is paced by the channel's own `bufferedAmount` and its
// `bufferedamountlow` event, not by timers: a worker page is usually a hidden
// tab where timers are throttled, and Chromium closes a channel whose send
// buffer passes 16 MiB. Messages leave in the order `send` was called.

import {
  DEFAULT_CHUNK_BYTES,
  frameMessage,
  HEADER_BYTES,
  Reassembler,
  type FrameHeader,
  type FrameSource,
  type Message,
} from './protocol.ts';
import type { Channel } from './channel.ts';
import { Emitter } from '../events.ts';

export interface LinkOptions {
  /** Bytes per frame including the header; ≤ 256 KiB. */
  chunkBytes?: number;
  /** Stop sending while the channel buffers this much; the buffer peaks at most one frame above it. */
  highWaterBytes?: number;
  /** Largest message accepted from the peer. */
  maxMessageBytes?: number;
  /** Rejects a message from the peer by its header, before it is buffered (wrong rank, unexpected tag/shape). */
  accept?: (header: FrameHeader) => string | null;
}

export interface LinkStats {
  framesSent: number;
  /** Everything handed to the channel, headers included. */
  bytesSent: number;
  /** Message payload handed to the channel, headers excluded. */
  payloadBytesSent: number;
  messagesSent: number;
  messagesReceived: number;
  framesDropped: number;
  lastDropReason: string;
  listenerErrors: number;
}

export const DEFAULT_HIGH_WATER_BYTES = 4 * 1024 * 1024;
/** Chromium closes a channel past 16 MiB buffered; stay well clear of it. */
export const MAX_HIGH_WATER_BYTES = 8 * 1024 * 1024;

interface Outgoing {
  frames: FrameSource;
  next: number;
  resolve: () => void;
  reject: (e: Error) => void;
}

export class Link {
  private readonly chunkBytes: number;
  private readonly highWater: number;
  private readonly reassembler: Reassembler;
  private readonly queue: Outgoing[] = [];
  private readonly messages = new Emitter<Message>((e) => {
    this.listenerErrors++;
    this.errors.emit(e instanceof Error ? e : new Error(String(e)));
  });
  // an error listener that throws has nowhere left to report to
  private readonly errors = new Emitter<Error>(() => {});
  private readonly closes = new Emitter<string>();
  private readonly malformed = new Emitter<string>();
  private nextMsgId = 0;
  private pumping = false;
  private closedReason: string | null = null;
  private sent = { framesSent: 0, bytesSent: 0, payloadBytesSent: 0, messagesSent: 0 };
  private messagesReceived = 0;
  private listenerErrors = 0;

  private readonly channel: Channel;

  constructor(channel: Channel, opts: LinkOptions = {}) {
    this.channel = channel;
    this.chunkBytes = opts.chunkBytes ?? DEFAULT_CHUNK_BYTES;
    this.highWater = opts.highWaterBytes ?? DEFAULT_HIGH_WATER_BYTES;
    if (!(this.highWater >= this.chunkBytes && this.highWater <= MAX_HIGH_WATER_BYTES)) {
      throw new RangeError(
        `highWaterBytes must be in [chunkBytes (${this.chunkBytes}), ${MAX_HIGH_WATER_BYTES}] — ` +
          `Chromium closes a channel past 16 MiB buffered; got ${this.highWater}`,
      );
    }
    this.reassembler = new Reassembler({ maxMessageBytes: opts.maxMessageBytes, accept: opts.accept });
    channel.bufferedAmountLowThreshold = Math.floor(this.highWater / 4);
    channel.addEventListener('bufferedamountlow', this.pump);
    channel.addEventListener('close', this.onChannelClose);
  }

  /**
   * Resolves once every frame is handed to the channel. The message's arrays are read as frames are
   * built: do not mutate them until then.
   */
  send(msg: Message): Promise<void> {
    if (this.closedReason !== null) return Promise.reject(new Error(`cannot send: ${this.closedReason}`));
    let frames: FrameSource;
    try {
      frames = frameMessage(msg, this.nextMsgId, this.chunkBytes);
    } catch (e) {
      return Promise.reject(e instanceof Error ? e : new Error(String(e)));
    }
    this.nextMsgId = (this.nextMsgId + 1) >>> 0;
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ frames, next: 0, resolve, reject });
      this.pump();
    });
  }

  /** When the peer last sent a frame this link took (ms since the epoch): what heartbeats judge a peer by. */
  lastHeardAt = Date.now();

  /** Feed one frame from the channel's `message` event. Never throws. */
  receive(frame: ArrayBuffer | ArrayBufferView): void {
    const droppedBefore = this.reassembler.dropped;
    const malformedBefore = this.reassembler.malformed;
    const msg = this.reassembler.push(frame);
    if (this.reassembler.malformed !== malformedBefore) this.malformed.emit(this.reassembler.lastError);
    // Only a frame the reassembler took is a sign of life: its header parsed, `accept` let its
    // message in, it was no replay or duplicate, and a message it completed decoded. Otherwise a
    // peer stuck sending garbage would look alive to heartbeats forever. Per frame, not per whole
    // message: a worker's heartbeat echo queues behind the reply it is sending, and a reply of many
    // frames may take longer than DEAD_AFTER_MS to arrive.
    if (this.reassembler.dropped === droppedBefore) this.lastHeardAt = Date.now();
    if (msg === null) return;
    this.messagesReceived++;
    this.messages.emit(msg);
  }

  /** Returns a function that removes the listener. */
  onMessage(cb: (msg: Message) => void): () => void {
    return this.messages.on(cb);
  }

  /** Errors thrown by `onMessage` listeners. Returns a function that removes the listener. */
  onError(cb: (error: Error) => void): () => void {
    return this.errors.on(cb);
  }

  /**
   * Hears of each whole message that arrived and did not decode (its frames were well formed): never a
   * wire's fault, always its sender's. Returns a function that removes the listener.
   */
  onMalformed(cb: (reason: string) => void): () => void {
    return this.malformed.on(cb);
  }

  /** Hears the link close (its channel closed, or its owner closed it), once. Returns a function that removes it. */
  onClose(cb: (reason: string) => void): () => void {
    return this.closes.on(cb);
  }

  /** Stops sending: queued and later sends reject. The channel itself is the owner's to close. */
  close(reason = 'link closed by its owner'): void {
    if (this.closedReason !== null) return;
    this.closedReason = reason;
    this.channel.removeEventListener('bufferedamountlow', this.pump);
    this.channel.removeEventListener('close', this.onChannelClose);
    const pending = this.queue.splice(0);
    for (const out of pending)
      out.reject(
        new Error(`${reason} before ${out.frames.frameCount - out.next} of ${out.frames.frameCount} frames were sent`),
      );
    this.closes.emit(reason);
    this.closes.clear();
  }

  get closed(): boolean {
    return this.closedReason !== null;
  }

  get stats(): LinkStats {
    return {
      ...this.sent,
      messagesReceived: this.messagesReceived,
      framesDropped: this.reassembler.dropped,
      lastDropReason: this.reassembler.lastError,
      listenerErrors: this.listenerErrors,
    };
  }

  private readonly onChannelClose = (): void => this.close('channel closed');

  // Sends frames until the channel holds highWater bytes; `bufferedamountlow` resumes it.
  private readonly pump = (): void => {
    if (this.pumping) return; // a channel that re-enters us from send() must not interleave frames
    this.pumping = true;
    try {
      while (this.queue.length > 0 && this.closedReason === null && this.channel.bufferedAmount < this.highWater) {
        const head = this.queue[0];
        try {
          const frame = head.frames.frame(head.next);
          this.channel.send(frame);
          this.sent.framesSent++;
          this.sent.bytesSent += frame.byteLength;
          this.sent.payloadBytesSent += frame.byteLength - HEADER_BYTES;
        } catch (e) {
          this.queue.shift();
          head.reject(e instanceof Error ? e : new Error(String(e)));
          continue;
        }
        if (++head.next === head.frames.frameCount) {
          this.queue.shift();
          this.sent.messagesSent++;
          head.resolve();
        }
      }
    } finally {
      this.pumping = false;
    }
  };
}
