/// <reference lib="webworker" />
import * as Comlink from 'comlink';
import { createEngine } from './engine.ts';

// The Web Worker that holds a page's engine; the page talks to it through comlink.
Comlink.expose(createEngine());
