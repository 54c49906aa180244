/// <reference lib="webworker" />
import * as Comlink from 'comlink';
import { createEngine, type EngineApi } from './engine.ts';

// The Web Worker that holds a page's engine; the page starts it with its threads and talks to it
// through comlink.
const factory = { start: (threads: number): EngineApi => Comlink.proxy(createEngine(threads)) };
export type EngineFactory = typeof factory;
Comlink.expose(factory);
