import { describe, expect, it } from 'vitest';
import { parseIceServers } from '../../server/peer-signaling.ts';

/** `--ice-servers` / DITSWARM_ICE_SERVERS: what the server publishes to every page in /signaling.json. */
describe('ICE server configuration', () => {
  it('nothing configured is no servers: host candidates only, enough on one LAN', () => {
    expect(parseIceServers(undefined)).toEqual([]);
    expect(parseIceServers('  ')).toEqual([]);
  });

  it('a comma-separated list of STUN URLs is one server per URL', () => {
    expect(parseIceServers('stun:stun.example.org:3478, stun:10.0.0.1')).toEqual([
      { urls: 'stun:stun.example.org:3478' },
      { urls: 'stun:10.0.0.1' },
    ]);
  });

  it('a JSON array carries TURN credentials through unchanged', () => {
    const servers = [
      {
        urls: ['turn:turn.example.org:3478?transport=udp', 'turns:turn.example.org:5349'],
        username: 'u',
        credential: 'p',
      },
      { urls: 'stun:stun.example.org' },
    ];
    expect(parseIceServers(JSON.stringify(servers))).toEqual(servers);
  });

  it('bad entries are rejected with what was expected', () => {
    expect(() => parseIceServers('http://stun.example.org')).toThrow(
      '"http://stun.example.org" is not a stun:, stuns:, turn: or turns: URL',
    );
    expect(() => parseIceServers('turn:turn.example.org')).toThrow(
      'ICE server 1: turn:turn.example.org needs "username" and "credential"',
    );
    expect(() => parseIceServers('[{"urls": []}]')).toThrow('"urls" must be a URL or a non-empty list of URLs, got []');
    expect(() => parseIceServers('[{"urls": "stun:a"}')).toThrow('ICE servers: not valid JSON');
    expect(() => parseIceServers('[{"urls": "stun:a", "username": 7}]')).toThrow('"username" must be text');
  });
});
