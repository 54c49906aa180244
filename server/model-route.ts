// A model folder as the server serves it to pages: its files as bytes, never as documents of the
// dashboard's origin (a readme.html in a folder must not run beside the dashboard's keys), and
// nothing outside the folder, symlinks included; each file's SHA-256 to a request that asks for it
// (RFC 9530's Want-Repr-Digest: a worker process checking its own copy of the folder); and, at the
// folder's own URL, the list of its files, so that pages never ask for an optional one it lacks.
import { readdir, realpath, stat } from 'node:fs/promises';
import { join, sep } from 'node:path';
import express, { type RequestHandler } from 'express';
import type { FolderListing } from '../core/model/files.ts';
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
  return [listsFolders(dir), ...digestsOf(dir), files];
}

/**
 * `GET <folder>/` of a folder inside `dir` answers its FolderListing: the files it would serve (symlinks that stay
 * inside `dir` included, dotfiles not), at any depth. Every other request goes on to the next handler.
 */
export function listsFolders(dir: string): RequestHandler {
  return (request, response, next) => {
    if ((request.method !== 'GET' && request.method !== 'HEAD') || !request.path.endsWith('/')) {
      next();
      return;
    }
    void folderListing(dir, request.path).then((listing) => {
      if (!listing) {
        next();
        return;
      }
      response.setHeader('X-Content-Type-Options', 'nosniff');
      response.setHeader('Content-Security-Policy', MODEL_FILE_CSP);
      response.setHeader('Cache-Control', 'no-cache');
      response.json(listing);
    }, next);
  };
}

/** The listing of the folder at `path` inside `dir`; null where that is no folder inside `dir`. */
async function folderListing(dir: string, path: string): Promise<FolderListing | null> {
  let folder: string;
  let root: string;
  try {
    [root, folder] = await Promise.all([realpath(dir), realpath(join(dir, decodeURIComponent(path)))]);
    if (!(await stat(folder)).isDirectory()) return null;
  } catch {
    return null; // no such folder, or a path that is no path
  }
  if (folder !== root && !folder.startsWith(root + sep)) return null;
  const files: FolderListing['files'] = [];
  const walked = new Set<string>();
  const walk = async (real: string, prefix: string): Promise<void> => {
    if (walked.has(real)) return; // a symlink back up the tree
    walked.add(real);
    for (const name of (await readdir(real)).sort()) {
      if (name.startsWith('.')) continue;
      const entry = await realpath(join(real, name)).catch(() => null); // a broken symlink is no file
      if (entry === null || (entry !== root && !entry.startsWith(root + sep))) continue;
      const info = await stat(entry).catch(() => null);
      if (info?.isDirectory()) await walk(entry, `${prefix}${name}/`);
      else if (info?.isFile()) files.push({ path: `${prefix}${name}`, size: info.size });
    }
  };
  await walk(folder, '');
  return { files };
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
