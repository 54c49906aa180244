import { describe, expect, it } from 'vitest';
import { addressAfterJoining, OLD_TOKEN_LINK, readWorkerLink } from '../../app/worker-link.ts';

// The worker link's token in the address bar (issue 33, finding 7): only the fragment's is taken,
// and it leaves the address bar once the page has joined.
const TOKEN = `${'a'.repeat(24)}.${'b'.repeat(32)}`;

describe('the worker link', () => {
  it("takes the fragment's token, else the one its tab kept for a reload", () => {
    const link = readWorkerLink(`http://10.0.0.5:5173/worker.html#token=${TOKEN}`, null);
    expect(link).toEqual({ token: TOKEN, refused: null, address: `http://10.0.0.5:5173/worker.html#token=${TOKEN}` });
    expect(readWorkerLink('http://localhost:5173/worker.html', 'kept').token).toBe('kept');
    expect(readWorkerLink(`http://localhost:5173/worker.html#token=${TOKEN}`, 'kept').token).toBe(TOKEN);
    expect(readWorkerLink('http://localhost:5173/worker.html', null).token).toBeNull();
  });

  it('refuses the old ?token= form, saying to use the #token= link, and takes the token out of the address bar at once', () => {
    const link = readWorkerLink(`http://localhost:5173/worker.html?token=${TOKEN}&x=1`, 'kept');
    expect(link.token).toBeNull();
    expect(link.refused).toBe(OLD_TOKEN_LINK);
    expect(OLD_TOKEN_LINK).toContain('#token=');
    expect(link.address).toBe('http://localhost:5173/worker.html?x=1');
    expect(link.address).not.toContain(TOKEN);
  });

  it('once joined, shows an address without the token, keeping what else its fragment said', () => {
    expect(addressAfterJoining(`http://localhost:5173/worker.html#token=${TOKEN}`)).toBe(
      'http://localhost:5173/worker.html',
    );
    expect(addressAfterJoining(`http://localhost:5173/worker.html#token=${TOKEN}&debug=1`)).toBe(
      'http://localhost:5173/worker.html#debug=1',
    );
  });
});
