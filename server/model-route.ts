// A model folder as the server serves it to pages: its files as bytes, never as documents of the
// dashboard's origin (a readme.html in a folder must not run beside the dashboard's keys), and
// nothing outside the folder, symlinks included; each file's SHA-256 to a request that asks for it
// (RFC 9530's Want-Repr-Digest: a worker process checking its own copy of the folder).
import { realpath } from 'node:fs/promises';
import { join, sep } from 'node:path';
import express, { type RequestHandler } from 'express';
import { reprDigest, wantsSha256 } from './file-digest.ts';

/** no script, style, frame or fetch, sandboxed: what a file opened from a model folder may do in a page */
export const MODEL_FILE_CSP = "default-src 'none'; sandbox";

/** the headers every file of a model is served with: bytes, never a document */
const AS_BYTES = {
  'Content-Type': 'application/octet-stream',
  'X-Content-Type-Options': 'nosniff',
  'Content-Security-Policy': MODEL_FILE_CSP,
};

/** Serves one file (with Range), as a model folder's files are served. */
export function serveModelFile(file: string): RequestHandler {
  return (_request, response) =>
    // its error (a file gone since the server started) is a 404 before anything was sent
    response.sendFile(file, { acceptRanges: true, dotfiles: 'allow', headers: AS_BYTES }, () => {
      if (!response.headersSent) response.sendStatus(404);
    });
}

/**
 * Serves `dir` (with Range), each file as application/octet-stream, with its Repr-Digest where asked; a path whose
 * real path leaves `dir` is 403.
 */
export function serveModelFolder(dir: string): RequestHandler[] {
  const files = express.static(dir, {
    fallthrough: false,
    dotfiles: 'deny',
    index: false,
    redirect: false,
    setHeaders(response) {
      for (const [name, value] of Object.entries(AS_BYTES)) response.setHeader(name, value);
    },
  });
  return [...digestsOf(dir), files];
}

/**
 * The Repr-Digest of a file of `dir` to a request that asks for it, before the file is served (by the next handler);
 * a path whose real path leaves `dir` is 403.
 */
export function digestsOf(dir: string): RequestHandler[] {
  const root = realpath(dir);
  const insideFolder: RequestHandler = (request, response, next) => {
    let relative: string;
    try {
      relative = decodeURIComponent(request.path);
    } catch {
      return void response.sendStatus(400);
    }
    void Promise.all([root, realpath(join(dir, relative))]).then(
      ([rootPath, filePath]) =>
        filePath === rootPath || filePath.startsWith(rootPath + sep) ? next() : void response.sendStatus(403),
      // a missing file is static's to answer (404)
      () => next(),
    );
  };
  const digest: RequestHandler = (request, response, next) => {
    if (!wantsSha256(request.get('Want-Repr-Digest'))) {
      next();
      return;
    }
    // a missing file, or a folder, is the file handler's to answer
    void reprDigest(join(dir, decodeURIComponent(request.path))).then(
      (value) => {
        response.setHeader('Repr-Digest', value);
        next();
      },
      () => next(),
    );
  };
  return [insideFolder, digest];
}
