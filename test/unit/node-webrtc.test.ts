import { describe, expect, it } from 'vitest';
import { hiddenCandidate, withoutHiddenCandidates } from '../../worker/node/webrtc.ts';

// A worker process's WebRTC (worker/node/webrtc.ts) leaves out a browser's mDNS-hidden candidates, which werift would
// spend 10 s looking up while the link falls back to the relay, and keeps every other line of the description.
describe("a browser's hidden candidates", () => {
  const hidden =
    'a=candidate:1840965416 1 udp 2113937151 8d1a8a3e-5b0c-4f5d-9c51-2b4f1c2e3f4a.local 54321 typ host generation 0';
  const ipv4 = 'a=candidate:324303476 1 udp 2113937151 192.0.2.2 57666 typ host generation 0 ufrag MmNF';
  const ipv6 = 'a=candidate:2 1 udp 2113939711 fd00::2 40000 typ host generation 0';
  const reflexive = 'a=candidate:3 1 udp 1677729535 203.0.113.9 3478 typ srflx raddr 0.0.0.0 rport 0';

  it('are the candidates at a .local name, in a description or trickled alone', () => {
    expect(hiddenCandidate(hidden)).toBe(true);
    expect(hiddenCandidate(hidden.slice('a='.length))).toBe(true);
    for (const shown of [ipv4, ipv6, reflexive]) expect(hiddenCandidate(shown), shown).toBe(false);
    // .local elsewhere in the line is no hidden address
    expect(hiddenCandidate(`${ipv4} network-name printer.local`)).toBe(false);
    expect(hiddenCandidate('a=ice-ufrag:abc.local ')).toBe(false);
  });

  it('leave a description, every other line as it was', () => {
    const sdp = ['v=0', 'm=application 9 UDP/DTLS/SCTP webrtc-datachannel', ipv4, hidden, ipv6, 'a=sctp-port:5000', ''];
    expect(withoutHiddenCandidates(sdp.join('\r\n'))).toBe(sdp.filter((l) => l !== hidden).join('\r\n'));
  });
});
