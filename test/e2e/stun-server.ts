import { createSocket } from 'node:dgram';

/**
 * A minimal STUN server (RFC 8489 Binding only) for the multi-host test: it answers each Binding
 * request with the sender's address and prints `binding <address>` so the test sees which hosts'
 * pages used the ICE servers the ditswarm server published.
 *
 *   node --import tsx test/e2e/stun-server.ts [port=3478]
 */
const MAGIC_COOKIE = 0x2112a442;
const BINDING_REQUEST = 0x0001;
const BINDING_SUCCESS = 0x0101;
const XOR_MAPPED_ADDRESS = 0x0020;

const socket = createSocket('udp4');
socket.on('message', (request, from) => {
  if (request.length < 20 || request.readUInt16BE(0) !== BINDING_REQUEST || request.readUInt32BE(4) !== MAGIC_COOKIE)
    return;
  const response = Buffer.alloc(32);
  response.writeUInt16BE(BINDING_SUCCESS, 0);
  response.writeUInt16BE(12, 2); // one attribute: 4-byte header + 8-byte IPv4 address
  request.copy(response, 4, 4, 20); // magic cookie and transaction id
  response.writeUInt16BE(XOR_MAPPED_ADDRESS, 20);
  response.writeUInt16BE(8, 22);
  response.writeUInt16BE(0x0001, 24); // IPv4
  response.writeUInt16BE(from.port ^ (MAGIC_COOKIE >>> 16), 26);
  const address = from.address.split('.').reduce((n, octet) => (n << 8) | Number(octet), 0);
  response.writeUInt32BE((address ^ MAGIC_COOKIE) >>> 0, 28);
  socket.send(response, from.port, from.address);
  console.log(`binding ${from.address}`);
});
socket.bind(Number(process.argv[2] ?? 3478), () => console.log(`stun listening on ${socket.address().port}`));
