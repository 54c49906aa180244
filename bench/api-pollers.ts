// The clients of bench/api-polls.ts, as a process of their own that the bench starts at the lowest priority (they
// stand for programs on other machines, and here share the job's cores): `clients` clients polling GET
// /v1/videos/{id}, each once a second or back to back, over kept-alive connections, until SIGTERM; prints
// "ready" once SIGTERM would stop them cleanly, then, when stopped, how long each poll took to be answered, as JSON.
//
//   node --import tsx bench/api-pollers.ts URL KEY ID CLIENTS every-second|back-to-back

import http from 'node:http';

const [url, key, id, clients, load] = process.argv.slice(2);
const agent = new http.Agent({ keepAlive: true, maxSockets: Number(clients) });
const took: number[] = [];
let stopping = false;
process.once('SIGTERM', () => (stopping = true));
process.stdout.write('ready\n');

const poll = () =>
  new Promise<void>((done, fail) => {
    const request = http.get(`${url}/v1/videos/${id}`, { agent, headers: { Authorization: `Bearer ${key}` } }, (r) => {
      r.resume();
      r.once('end', done);
    });
    request.once('error', fail);
  });

async function client() {
  while (!stopping) {
    const asked = performance.now();
    await poll();
    took.push(performance.now() - asked);
    if (load === 'every-second') await new Promise((r) => setTimeout(r, Math.max(0, 1000 - (took.at(-1) ?? 0))));
  }
}

await Promise.all(Array.from({ length: Number(clients) }, client));
agent.destroy();
process.stdout.write(JSON.stringify(took));
