import { startServer } from '../../server/serve.ts';

/**
 * Starts the ditswarm server in-process on a free port for the whole run and publishes
 * its URL as DITSWARM_URL. With DITSWARM_URL already set, the tests use that server instead.
 */
export default async function globalSetup(): Promise<(() => Promise<void>) | undefined> {
  if (process.env.DITSWARM_URL) return undefined;
  const server = await startServer({ port: 0, quiet: true });
  process.env.DITSWARM_URL = server.url;
  return () => server.close();
}
