// One kind of event and who listens to it. Listeners hear each event in the order they were added,
// as they were when it was emitted; one that throws is reported, and the others still hear it.

export class Emitter<T> {
  private readonly listeners = new Set<(event: T) => void>();

  /** `onListenerError` hears what a listener threw (a page logs it, a link counts it). */
  constructor(private readonly onListenerError: (error: unknown) => void = logListenerError) {}

  /** Returns a function that removes the listener. */
  on(listener: (event: T) => void): () => void {
    this.listeners.add(listener);
    return () => this.off(listener);
  }

  off(listener: (event: T) => void): void {
    this.listeners.delete(listener);
  }

  emit(event: T): void {
    for (const listener of [...this.listeners]) {
      try {
        listener(event);
      } catch (error) {
        this.onListenerError(error);
      }
    }
  }

  get size(): number {
    return this.listeners.size;
  }

  clear(): void {
    this.listeners.clear();
  }
}

function logListenerError(error: unknown): void {
  console.error('an event listener failed', error);
}
