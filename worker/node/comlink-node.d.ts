// comlink ships its Node adapter's types beside its .mjs, where TypeScript does not look for an .mjs import.
declare module 'comlink/dist/esm/node-adapter.mjs' {
  export { default } from 'comlink/dist/esm/node-adapter';
}
