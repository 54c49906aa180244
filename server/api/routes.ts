// The HTTP side of the video API, under /v1: OpenAI's video endpoints (POST /videos, GET /videos[/{id}[/content]],
// DELETE /videos/{id}) with a long poll (?wait=) and server-sent events for progress, GET /swarm, and POST
// /swarm/revoke (a new worker link; the old one's workers leave). Every call needs the key; errors are OpenAI's
// `{ error: { message, type, param } }`. openapi.ts documents all of it.

import { resolve } from 'node:path';
import express, { type NextFunction, type Request, type Response } from 'express';
import { clientSource, perAddressLimit } from '../rate-limit.ts';
import type { Origins } from '../origins.ts';
import { authorized } from './api-key.ts';
import type { Coordinator } from './coordinator-host.ts';
import { DiskFullError, isFinal, type VideoJob } from './job-db.ts';
import { OPENAPI } from './openapi.ts';
import { MAX_FORM_BYTES, readVideoForm } from './video-form.ts';
import { parseVideoRequest, RequestError } from './video-request.ts';
import { videoObject } from './video-object.ts';
import { QueueError, type VideoJobs } from './video-jobs.ts';

/** What the routes serve, once the coordinator is up. */
export interface ApiParts {
  jobs: VideoJobs;
  coordinator: Coordinator;
  /** the model a job runs on unless it names one (the server's --model) */
  model?: string;
  /** "WxH" of that model's default job, named among the sizes a bad size is told it may be */
  defaultSize?: string | null;
  /** hosts besides this server that a job's model and LoRA files may be read from (model-hosts.ts) */
  modelHosts?: readonly string[];
}

export interface ApiOptions {
  key: string;
  origins: Origins;
  /** requests a key may make per minute (in bursts of as many) */
  requestsPerMinute: number;
}

/** the longest a long poll waits */
export const MAX_WAIT_S = 60;
/** jobs in one page of GET /videos at most */
const MAX_PAGE = 100;

const TYPES: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  403: 'permission_error',
  404: 'not_found_error',
  409: 'conflict_error',
  413: 'invalid_request_error',
  416: 'invalid_request_error',
  429: 'rate_limit_error',
  500: 'server_error',
  503: 'service_unavailable_error',
  507: 'insufficient_storage_error',
};

function sendError(response: Response, status: number, message: string, param: string | null = null): void {
  response.status(status).json({ error: { message, type: TYPES[status] ?? 'server_error', param } });
}

/** what express's sendFile fails with: a range past the file's end is 416, with the Content-Range to send */
interface SendError extends Error {
  status?: number;
  headers?: Record<string, string>;
}

/** The API's router; `parts` settles once its coordinator is up (calls before wait for it). */
export function videoApi(parts: Promise<ApiParts>, { key, origins, requestsPerMinute }: ApiOptions): express.Router {
  const router = express.Router();
  const withinLimit = perAddressLimit(requestsPerMinute, 60_000);
  // a page of another site may not call it (the server's Origin rule), and every call needs the key
  router.use((request, response, next) => {
    if (!origins.originAllowed(request.headers.origin)) {
      sendError(response, 403, `pages of ${request.headers.origin} may not use this API`);
      return;
    }
    // before the key: a client guessing keys meets the limit as soon as one with the key would
    const { address } = clientSource(request.socket.remoteAddress);
    if (!withinLimit(`address ${address}`)) {
      sendError(response, 429, `more than ${requestsPerMinute} requests a minute from ${address}: wait a moment`);
      return;
    }
    if (!authorized(request.headers.authorization, key)) {
      sendError(
        response,
        401,
        'this API needs its key: Authorization: Bearer <key> (npm start -- --api prints where the key is kept)',
      );
      return;
    }
    // one bucket for the key (a caller with the key is the owner's program, from wherever it calls)
    if (!withinLimit('key')) {
      sendError(response, 429, `more than ${requestsPerMinute} requests a minute with this key: wait a moment`);
      return;
    }
    next();
  });
  router.use(express.json({ limit: '64kb' }));

  type Serve = (p: ApiParts, request: Request, response: Response) => Promise<void> | void;
  /** Serves with the API's parts once they are up; its QueueErrors and RequestErrors answered with their status. */
  const answer = async (serve: Serve, request: Request, response: Response) => {
    try {
      await serve(await parts, request, response);
    } catch (e) {
      if (e instanceof RequestError) sendError(response, 400, e.message, e.param);
      else if (e instanceof QueueError) sendError(response, e.status, e.message);
      else if (e instanceof DiskFullError) sendError(response, 507, `${e.message}: nothing was stored`);
      else {
        console.error('api:', e);
        sendError(response, 500, `the server failed: ${(e as Error).message}`);
      }
    }
  };
  const handle =
    (serve: Serve) =>
    (request: Request, response: Response): void => {
      void answer(serve, request, response);
    };

  router.get('/openapi.json', (_request, response) => {
    response.json(OPENAPI);
  });

  router.post(
    '/videos',
    // the form OpenAI documents (and its SDK sends) beside JSON; bounded as the image it may carry is
    express.raw({ type: 'multipart/form-data', limit: MAX_FORM_BYTES }),
    handle(async (p, request, response) => {
      const form = request.is('multipart/form-data')
        ? await readVideoForm(request.body, String(request.headers['content-type']))
        : null;
      const asked = parseVideoRequest(form ? form.body : request.body, {
        model: p.model,
        defaultModelSize: p.defaultSize ?? null,
        modelHosts: p.modelHosts,
      });
      const reference = form?.reference;
      const job = await p.jobs.accept(
        reference ? { ...asked, inputReference: reference.info } : asked,
        reference?.bytes,
      );
      response.status(202).json(videoObject(job));
    }),
  );

  router.get(
    '/videos',
    handle((p, request, response) => {
      const limit = request.query.limit === undefined ? 20 : Number(request.query.limit);
      if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE)
        throw new RequestError(`limit is a whole number from 1 to ${MAX_PAGE}`, 'limit');
      const after = typeof request.query.after === 'string' ? request.query.after : undefined;
      if (after !== undefined) p.jobs.existing(after);
      const page = p.jobs.list({ limit: limit + 1, after });
      const data = page.slice(0, limit).map(videoObject);
      response.json({
        object: 'list',
        data,
        first_id: data[0]?.id ?? null,
        last_id: data.at(-1)?.id ?? null,
        has_more: page.length > limit,
      });
    }),
  );

  router.get(
    '/videos/:id',
    handle(async (p, request, response) => {
      let job = p.jobs.existing(request.params.id);
      const wait = request.query.wait === undefined ? 0 : Number(request.query.wait);
      if (!(wait >= 0 && wait <= MAX_WAIT_S))
        throw new RequestError(`wait is a number of seconds from 0 to ${MAX_WAIT_S}`, 'wait');
      if (wait > 0 && !isFinal(job.status))
        job = await new Promise<VideoJob>((resolve) => {
          const done = (j: VideoJob) => {
            clearTimeout(timer);
            off();
            request.off('close', gone);
            resolve(j);
          };
          const gone = () => done(job);
          const off = p.jobs.watch(job.id, done);
          // a job deleted while its poll waited answers as it last was: a throw here, in a timer, would end the server
          const timer = setTimeout(() => done(p.jobs.get(job.id) ?? job), wait * 1000);
          request.once('close', gone);
        });
      response.json(videoObject(job));
    }),
  );

  router.get(
    '/videos/:id/events',
    handle((p, request, response) => {
      const job = p.jobs.existing(request.params.id);
      response.writeHead(200, {
        'Content-Type': 'text/event-stream',
        'Cache-Control': 'no-cache',
        Connection: 'keep-alive',
      });
      const send = (j: VideoJob) => {
        response.write(`event: video\ndata: ${JSON.stringify(videoObject(j))}\n\n`);
        if (isFinal(j.status)) stop();
      };
      const off = p.jobs.watch(job.id, send);
      const stop = () => {
        off();
        response.end();
      };
      request.once('close', off);
      send(job);
    }),
  );

  router.get(
    '/videos/:id/content',
    handle((p, request, response) => {
      const job = p.jobs.existing(request.params.id);
      const variant = request.query.variant ?? 'video';
      if (variant !== 'video' && variant !== 'latent')
        throw new RequestError('variant is "video" (the WebM) or "latent" (safetensors)', 'variant');
      if (job.status !== 'completed')
        throw new QueueError(`${job.id} is ${job.status}: its content is there once it has completed`, 409);
      const path = p.jobs.files.path(job.id, variant);
      if (!path)
        throw new QueueError(
          `${job.id} has no ${variant}${variant === 'video' ? ' (it asked for output "latent")' : ''}`,
          404,
        );
      response.setHeader('Content-Type', variant === 'video' ? 'video/webm' : 'application/octet-stream');
      response.setHeader(
        'Content-Disposition',
        `attachment; filename="${job.id}${variant === 'video' ? '.webm' : '.safetensors'}"`,
      );
      // no shared cache keeps what the key guards (sendFile would say `public`)
      response.setHeader('Cache-Control', 'private');
      // with Range, as a <video> element and a resumed download ask
      return new Promise<void>((done, fail) => {
        response.sendFile(resolve(path), { cacheControl: false, lastModified: false }, (error?: SendError) => {
          if (!error) done();
          else if (error.status === 416) {
            response.removeHeader('Content-Disposition');
            response.setHeader('Content-Range', error.headers?.['Content-Range'] ?? '');
            sendError(
              response,
              416,
              `the range ${request.headers.range ?? ''} is not within the file's bytes (Content-Range says how many)`,
            );
            done();
          } else if (response.headersSent) done();
          else fail(error);
        });
      });
    }),
  );

  router.delete(
    '/videos/:id',
    handle((p, request, response) => {
      const job = p.jobs.existing(request.params.id);
      if (isFinal(job.status)) {
        p.jobs.remove(job.id);
        response.json({ id: job.id, object: 'video.deleted', deleted: true });
      } else response.json(videoObject(p.jobs.cancel(job.id)));
    }),
  );

  router.get(
    '/swarm',
    handle(async (p, _request, response) => {
      response.json(await p.coordinator.swarm());
    }),
  );

  router.post(
    '/swarm/revoke',
    handle(async (p, _request, response) => {
      try {
        await p.coordinator.revokeJoinLink();
      } catch (e) {
        throw new QueueError(`the worker link was not revoked: ${(e as Error).message}; try again`, 503);
      }
      response.json(await p.coordinator.swarm());
    }),
  );

  // a body that is no JSON, or too large, is the caller's to fix: said as the API says errors
  router.use(
    (
      error: { status?: number; type?: string; message?: string; limit?: number },
      _request: Request,
      response: Response,
      next: NextFunction,
    ) => {
      if (error.type === 'entity.too.large')
        sendError(response, 413, `the body is larger than ${Math.round((error.limit ?? 0) / 1024)} KB`);
      else if (error.type === 'entity.parse.failed')
        sendError(response, 400, `the body is no JSON: ${error.message ?? ''}`);
      else next(error);
    },
  );
  router.use((request, response) =>
    sendError(response, 404, `no such endpoint: ${request.method} ${request.baseUrl}${request.path}`),
  );
  return router;
}
