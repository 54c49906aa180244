// Who may talk to this server: requests must name it by one of its own host names (localhost, its
// LAN addresses, its machine name), so that a web page of another site cannot reach it through a
// DNS name it controls (DNS rebinding) and read the signaling key; browser pages must come from
// one of those origins or one the server was told to allow (a page of the user's own embedding
// the library through `openSwarm(origin)`), for websockets as for CORS.
import { isIPv6 } from 'node:net';
import { hostname, networkInterfaces, type NetworkInterfaceInfo } from 'node:os';

/**
 * This machine's IPv4 addresses other pages of a LAN reach it at (IPv6 LAN addresses are not
 * served to: open the dashboard at an IPv4 one).
 */
export function lanAddresses(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((nic): nic is NetworkInterfaceInfo => nic?.family === 'IPv4' && !nic.internal)
    .map((nic) => nic.address);
}

/**
 * Every name this server answers to: the loopback, its machine name (and `<name>.local`), the names it was given
 * (`--host`), its LAN addresses now. IPv6 addresses bare, as a certificate names them.
 */
export function serverNames(hosts: readonly string[] = []): string[] {
  const machine = hostname().toLowerCase();
  const names = ['localhost', '127.0.0.1', '::1', machine, `${machine}.local`, ...hosts, ...lanAddresses()];
  return [...new Set(names.map((n) => n.toLowerCase()))];
}

/** Every origin this server answers at on `port`: each of its names over http, and over https with TLS. */
export function ownOrigins(port: number, hosts: readonly string[], tls: boolean): string[] {
  return serverNames(hosts).flatMap((name) => {
    const host = isIPv6(name) ? `[${name}]` : name;
    return [`http://${host}:${port}`, ...(tls ? [`https://${host}:${port}`] : [])];
  });
}

export interface Origins {
  /** the Host header names this server */
  hostAllowed(host: string | undefined): boolean;
  /** a browser's Origin header is this server's or an allowed one (no Origin: not a browser page) */
  originAllowed(origin: string | undefined): boolean;
}

/**
 * `allowOrigins`: origins beyond the server's own whose pages may use it (`--allow-origin`).
 * `port`: the port the server listens on, once it does: its own origins are at that port only (a
 * page another server of this machine serves is not one of its own), over http and https alike.
 * `hosts`: names of this server beyond its own (`--host`: a DNS name, a name other machines know it by).
 */
export function serverOrigins(
  allowOrigins: readonly string[],
  port: () => number | null,
  hosts: readonly string[] = [],
): Origins {
  const extra = new Set(allowOrigins.map((o) => new URL(o).origin));
  const own = (name: string) => serverNames(hosts).includes(name.replace(/^\[|\]$/g, ''));
  const hostOf = (host: string) => {
    try {
      return new URL(`http://${host}`).hostname.toLowerCase();
    } catch {
      return null;
    }
  };
  return {
    hostAllowed(host) {
      const name = host && hostOf(host);
      return !!name && (own(name) || [...extra].some((o) => new URL(o).hostname === name));
    },
    originAllowed(origin) {
      if (origin === undefined) return true;
      if (extra.has(origin)) return true;
      try {
        const url = new URL(origin);
        const defaultPort = { 'http:': 80, 'https:': 443 }[url.protocol];
        const at = url.port === '' ? defaultPort : Number(url.port);
        return own(url.hostname.toLowerCase()) && at !== undefined && at === port();
      } catch {
        return false;
      }
    },
  };
}
