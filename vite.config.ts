import { resolve } from 'node:path';
import { defineConfig } from 'vite';

// One multi-page app: the dashboard (index.html), the worker page (worker.html), the video API's page (api.html) and
// the page a plain-http LAN address shows (trust.html: how to trust the swarm's CA once).
// Cross-origin isolation lets onnxruntime-web use SharedArrayBuffer where it wants threads.
const isolation = {
  'Cross-Origin-Opener-Policy': 'same-origin',
  'Cross-Origin-Embedder-Policy': 'require-corp',
};

export default defineConfig({
  root: resolve(import.meta.dirname, 'app'),
  publicDir: resolve(import.meta.dirname, 'public'),
  build: {
    outDir: resolve(import.meta.dirname, 'dist/app'), // dist/lib is the library's (npm run build:lib)
    emptyOutDir: true,
    target: 'es2022',
    rolldownOptions: {
      input: {
        dashboard: resolve(import.meta.dirname, 'app/index.html'),
        worker: resolve(import.meta.dirname, 'app/worker.html'),
        api: resolve(import.meta.dirname, 'app/api.html'),
        trust: resolve(import.meta.dirname, 'app/trust.html'),
      },
    },
  },
  worker: { format: 'es' },
  server: { headers: isolation, fs: { allow: [import.meta.dirname] } },
  preview: { headers: isolation },
});
