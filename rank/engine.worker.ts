/// <reference lib="webworker" />
import * as Comlink from 'comlink';
import { createEngine, type EngineApi, type EngineMove } from './engine.ts';

// The Web Worker that holds a page's engine; the page starts it with its threads and talks to it
// through comlink. Each move of the engine is posted to the page as it happens (comlink leaves
// messages without its ids alone): the page's pulse says how far the engine has got.
const factory = {
  start: (threads: number): EngineApi =>
    Comlink.proxy(createEngine(threads, (move: EngineMove) => self.postMessage({ engineMove: move }))),
};
export type EngineFactory = typeof factory;
Comlink.expose(factory);
