// Where exchanged tensors wait for their receiver: a message delivered under a key (tag and
// sender) is kept until its receiver asks for it, and a receiver that asks first is resolved when
// the message arrives. So a fast peer may run ahead by a phase without anything being lost.

interface Slot<T> {
  value?: T;
  resolve?: (value: T) => void;
  reject?: (error: Error) => void;
}

export class Mailbox<T> {
  private readonly slots = new Map<string, Slot<T>>();

  /**
   * Hands `value` to the receiver waiting under `key`, or keeps it: 'taken' or 'kept' ('duplicate':
   * one is kept already, and stays).
   */
  deliver(key: string, value: T): 'taken' | 'kept' | 'duplicate' {
    const slot = this.slot(key);
    if (slot.resolve) return (slot.resolve(value), 'taken');
    if (slot.value !== undefined) return 'duplicate';
    slot.value = value;
    return 'kept';
  }

  /** The message under `key`, now or once it arrives; receiving it empties the slot. */
  receive(key: string): Promise<T> {
    const slot = this.slot(key);
    const take = (value: T) => (this.slots.delete(key), value);
    if (slot.value !== undefined) return Promise.resolve(take(slot.value));
    return new Promise<T>((resolve, reject) => {
      slot.resolve = (value) => resolve(take(value));
      slot.reject = reject;
    });
  }

  /** A receiver waits under `key`. */
  awaited(key: string): boolean {
    return this.slots.get(key)?.resolve !== undefined;
  }

  /** Drops a message nobody will ask for (a receiver waiting under `key` keeps waiting). */
  drop(key: string): void {
    if (this.slots.get(key)?.resolve === undefined) this.slots.delete(key);
  }

  /** Every waiting receiver fails with `error`; messages nobody asked for are dropped. */
  rejectAll(error: Error): void {
    for (const slot of this.slots.values()) slot.reject?.(error);
    this.slots.clear();
  }

  private slot(key: string): Slot<T> {
    let slot = this.slots.get(key);
    if (!slot) this.slots.set(key, (slot = {}));
    return slot;
  }
}
