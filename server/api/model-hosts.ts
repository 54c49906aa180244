// Where a job's model folder and LoRA files may be: the coordinator page fetches them from the server's own machine,
// so a URL of the caller's choosing would have it read addresses only that machine reaches (a metadata service,
// another local server) and quote the reply in the job's error. A job names the server's own folders (/models/…,
// /loras/…), the model the server runs on, or a URL of a host the deployer allowed at start (--allow-model-host).
// A host is read literally, as the URL parser writes it: a name is the deployer's choice, and none is resolved here;
// an address of this machine or its networks is refused whoever allowed it.

/** [first address, prefix bits] of IPv4's loopback, link-local, private, shared (CGNAT) and "this network" blocks */
const INSIDE_V4: [number[], number][] = [
  [[0, 0, 0, 0], 8],
  [[10, 0, 0, 0], 8],
  [[100, 64, 0, 0], 10],
  [[127, 0, 0, 0], 8],
  [[169, 254, 0, 0], 16],
  [[172, 16, 0, 0], 12],
  [[192, 168, 0, 0], 16],
];

const v4Number = (octets: number[]) => octets.reduce((n, o) => n * 256 + o, 0);

function insideV4(octets: number[]): boolean {
  const n = v4Number(octets);
  return INSIDE_V4.some(
    ([net, bits]) => Math.floor(n / 2 ** (32 - bits)) === Math.floor(v4Number(net) / 2 ** (32 - bits)),
  );
}

/** the eight groups of an IPv6 address as the URL parser writes it (lowercase hex, `::` for zeros, no dotted part) */
function v6Groups(address: string): number[] | null {
  const halves = address.split('::');
  if (halves.length > 2) return null;
  const parse = (part: string) => (part ? part.split(':').map((g) => parseInt(g, 16)) : []);
  const [before, after] = [parse(halves[0]), parse(halves[1] ?? '')];
  const groups =
    halves.length === 1 ? before : [...before, ...Array<number>(8 - before.length - after.length).fill(0), ...after];
  return groups.length === 8 && groups.every((g) => g >= 0 && g <= 0xffff) ? groups : null;
}

function insideV6(address: string): boolean {
  const g = v6Groups(address);
  if (!g) return false;
  const zeros = (n: number) => g.slice(0, n).every((x) => x === 0);
  if (zeros(7) && g[7] <= 1) return true; // :: and ::1
  if (zeros(5) && g[5] === 0xffff) return insideV4([g[6] >> 8, g[6] & 255, g[7] >> 8, g[7] & 255]); // IPv4-mapped
  return (g[0] & 0xfe00) === 0xfc00 || (g[0] & 0xffc0) === 0xfe80; // unique-local fc00::/7, link-local fe80::/10
}

/** `hostname` as a URL writes it, without a name's trailing dot */
const bare = (hostname: string) => hostname.toLowerCase().replace(/\.$/, '');

/**
 * Whether a URL's hostname is a loopback, link-local or private address (or a name RFC 6761 keeps for loopback).
 * The URL parser has written every IPv4 form (2130706433, 0x7f.1) as four decimal octets, and IPv6 in hex groups.
 */
function inside(hostname: string): boolean {
  const host = bare(hostname);
  if (host === 'localhost' || host.endsWith('.localhost')) return true;
  if (host.startsWith('[')) return insideV6(host.slice(1, -1));
  const octets = /^(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(host);
  return octets !== null && insideV4(octets.slice(1).map(Number));
}

const INSIDE_WORDS = 'a loopback, link-local or private address';

/** The hosts of `--allow-model-host` flags, as URLs write them; throws, saying why, for one it will not take. */
export function allowedModelHosts(flags: readonly string[]): string[] {
  return flags.map((flag) => {
    const url = URL.canParse(`http://${flag}/`) ? new URL(`http://${flag}/`) : null;
    if (url && flag !== '' && inside(url.hostname))
      throw new Error(
        `--allow-model-host ${flag} is ${INSIDE_WORDS}: a job's model would be read from this machine's side of the ` +
          'network. Serve the folder with --model (jobs name it /models/local), or allow a name it has',
      );
    if (!url || flag === '' || url.port || url.pathname !== '/' || url.username || url.host !== flag.toLowerCase())
      throw new Error(
        `--allow-model-host takes a host name or address, such as models.example.org, got ${JSON.stringify(flag)}`,
      );
    return bare(url.hostname);
  });
}

export interface ModelPlaces {
  /** the hosts --allow-model-host named (allowedModelHosts) */
  modelHosts?: readonly string[];
  /** the model the server runs on (its --model), which a job may name whatever its URL */
  model?: string;
}

/** paths under which the server serves its own model folders and LoRA files (server/serve.ts) */
const OWN_PATH = /^\/(models|loras)\/[^?#\\]+$/;

/** Why a job may not read `url` (a model folder's or a LoRA file's), or null where it may. */
export function modelUrlRefusal(url: string, { modelHosts = [], model }: ModelPlaces): string | null {
  if (url === model) return null;
  if (url.startsWith('/') && !url.startsWith('//')) {
    // a `..` would climb out of them, to the API's own paths on the page's origin
    if (OWN_PATH.test(url) && !url.split('/').some((part) => part === '..' || part === '.')) return null;
    return `${JSON.stringify(url)} is no path of this server's model folders or LoRA files (/models/…, /loras/…)`;
  }
  const parsed = URL.canParse(url) ? new URL(url) : null;
  if (!parsed || (parsed.protocol !== 'http:' && parsed.protocol !== 'https:'))
    return `${JSON.stringify(url.slice(0, 200))} is neither a path this server serves (/models/…) nor an http(s) URL`;
  if (inside(parsed.hostname))
    return (
      `${parsed.host} is ${INSIDE_WORDS}, which a job may not read: ` +
      'name the folder by its path on this server (/models/…)'
    );
  if (!modelHosts.includes(bare(parsed.hostname)))
    return (
      `${parsed.host} is not a host this server reads models from` +
      (modelHosts.length ? ` (${modelHosts.join(', ')})` : '') +
      `: name a folder of this server (/models/…), or start it with --allow-model-host ${bare(parsed.hostname)}`
    );
  return null;
}
