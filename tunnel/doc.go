// Package tunnel is the transport between the hub and its edges: one
// connection per edge, dialled by the edge from behind any NAT, with one
// stream per tunneled TCP connection in either direction.
//
// The edge runs a [Client]; the hub runs a [Server]. Both ends authenticate
// with TLS 1.3 certificates (the node's certificate on the edge, the hub's
// on the hub) and negotiate [ALPN].
//
// # Transports
//
// QUIC (quic-go) over UDP is the normal transport: every stream has its own
// flow control and loss recovery, so a stalled or slow stream never holds
// up another, and the hub follows an edge whose NAT mapping changes
// mid-connection. Where UDP is blocked the client falls back, after
// ClientConfig.QUICAttempts handshakes went unanswered, to TCP+TLS on the
// same host:port with yamux as the stream multiplexer; the hub serves it
// from its API port via http.Server.TLSNextProto[ALPN] and [Server.ServeConn].
// A client on the fallback tries QUIC again every QUICProbeInterval and
// moves over without a gap. Streams, preambles, the control stream and
// [PeerOf] are the same on both transports; the fallback has head-of-line
// blocking, which is accepted in degraded mode.
//
// # Bulk lanes
//
// quic-go's congestion control is NewReno, which a long or lossy link
// holds to a fraction of what TCP with BBR moves. A stream whose dial
// context is marked with [WithBulk] (Client.DialContext and Server.Dial
// alike) travels instead on the node's bulk lane: a TCP+TLS connection
// with yamux, like the fallback, whose sockets run BBR (TCP_CONGESTION set
// on both ends; where the kernel lacks it the lane keeps the kernel's
// default, logged and counted in ClientStats and ServerStats). The edge
// dials the lane on demand, to the hub's address, with the node's
// certificate and the tunnel's ALPN; the hub serves it through ServeConn
// and attaches it to the node's session, which it belongs to: no lane
// without a session, and a session's end closes its lanes. A hub→edge
// bulk dial without a lane asks the edge for one on the control stream
// and waits for it. A lane without streams for ClientConfig.BulkIdle
// closes. A lane is plain TCP and does not survive a NAT rebinding: its
// streams are reset (*[ResetError], code 0x207), the next bulk stream opens
// a new lane, and QUIC streams are not affected. Where no lane can be had
// (the hub or edge predates lanes, DisableBulk, TCP blocked) bulk streams
// travel on the tunnel; one unmarked stream never waits for a lane.
//
// # Streams
//
// Edge→hub streams carry the agent's API traffic as plain HTTP/1.1: the
// agent sets rest.Config.Dial to [Client.DialContext] and Host to
// "http://hub", and the hub runs http.Server.Serve([Server.Listener]).
// Hub→edge streams come from [Server.Dial] with a target ([TargetNode] or
// "tcp:HOST:PORT"); the dial is optimistic: the hub writes its request
// right behind the preamble and the edge's one-byte status arrives with the
// first response bytes, so the first byte takes about one round trip plus
// the edge's local dial.
//
// Every stream is a net.Conn. Close sends the data written so far, then
// EOF, and makes the peer's further writes fail; CloseWrite half-closes. A
// stream reset by either side surfaces as a *[ResetError], never as
// io.EOF; a refused hub dial as a *[DialError].
//
// # Loss
//
// On the QUIC transport both ends send parity packets to a peer whose path
// loses packets (forward error correction below QUIC, see fecConn): a
// single lost packet in a group is rebuilt by the receiver instead of
// costing a retransmission and a halved congestion window. Parity starts
// when QUIC reports 0.5 % loss or more while the round trip stays near the
// path's minimum, grows while losses still get through, shrinks when
// losses come with a queue (those are congestion: parity would only add
// to it) and stops after a clean half minute; a loss-free path never sees
// it. ServerConfig.DisableFEC and ClientConfig.DisableFEC turn it off.
//
// # Control stream, liveness and reconnects
//
// The first stream an edge opens is the control stream. It carries the
// [Hello] (node, agent version, last resourceVersions), the hub's welcome,
// the edge's heartbeats, the edge's reports ([Client.Report]: the latest
// payload is sent at once and again on every new connection, so a restarted
// hub learns it), the edge's pushes ([Client.Push]: a stream of payloads
// tied to one connection, in order, never resent) and the hub's drain notice (GoAway with a reconnect
// window; the edge reconnects at a uniformly random time in it). Heartbeats
// are the NAT keepalive too: an idle edge sends one small packet per
// HeartbeatInterval (15s) and nothing else, and the hub only acknowledges.
// The idle timeout is 45s. Over TCP the hub's read deadline on the control
// stream enforces it; over QUIC the transport's idle timer does, and the
// hub waits twice as long for a heartbeat, which retransmissions on a lossy
// path can delay past the idle timeout while other packets get through.
// Reconnects use full-jitter exponential backoff, including the first
// attempt after a detected loss. A newer connection of a node replaces the
// older one.
//
// # Limits
//
// The hub meters new connections with a token bucket (refused QUIC
// handshakes get CONNECTION_REFUSED at once, so edges back off), caps
// concurrent streams and dials per edge, and lets connection windows grow
// only within a global memory budget.
//
// # Wire format (version 1, ALPN "tether-tunnel/1")
//
// A frame is a type byte, a uvarint payload length (at most 64 KiB) and the
// payload. Strings are a uvarint length and bytes.
//
//	0x01 hello      edge→hub  uvarint protocol version (1), string node,
//	                          string agent version, uvarint n,
//	                          n × (string resource, string resourceVersion),
//	                          uvarint features (bits as in the features
//	                          frame; older edges end before it)
//	0x02 welcome    hub→edge  uvarint idle timeout (ms), uvarint flags
//	                          (bit 0: the hub echoes heartbeats; bit 1: the
//	                          hub decodes parity packets; bit 2: the hub
//	                          accepts bulk lanes)
//	0x03 heartbeat  edge→hub  empty; echoed by the hub on the TCP fallback
//	0x04 goaway     hub→edge  uvarint reconnect window (ms)
//	0x05 features   edge→hub  uvarint flags (bit 0: the edge decodes parity
//	                          packets; bit 1: the edge opens bulk lanes
//	                          when asked); sent right after the hello,
//	                          for hubs that read no features in it
//	0x06 report     edge→hub  opaque payload of Client.Report (at most 64
//	                          KiB); the latest one is sent again at every
//	                          connect
//	0x07 push       edge→hub  opaque payload of Client.Push (at most 64
//	                          KiB); sent once, on the connection it was
//	                          pushed for
//	0x08 lane       edge→hub  empty; first frame of a bulk lane's first
//	                          stream, instead of the hello; the hub
//	                          answers with a welcome (flags 0)
//	0x09 laneask    both      empty; hub→edge: open a bulk lane (the hub
//	                          has none it can use); edge→hub: a lane could
//	                          not be opened, send bulk dials on the tunnel
//	0x0a laneidle   both      empty; on a lane's first stream: the edge
//	                          will close the lane; the hub's echo says it
//	                          opens no more streams on it
//	0x10 open       edge→hub  stream preamble of an API stream; empty
//	0x11 dial       hub→edge  stream preamble; payload is the target
//
// The control stream is a sequence of frames; unknown frame types are
// skipped, so frames can be added within version 1. Other streams start
// with one preamble frame. On a dial stream the edge answers with one
// status byte: 0x00 connected, or 0x01 followed by a string with the error.
// Then the stream carries the tunneled bytes.
//
// Over the TCP fallback the tunneled bytes that follow the preamble (or
// the status) travel in data frames, because yamux cannot reset a single
// stream: 0x00 uvarint length, bytes; 0x01 uvarint error code ends the
// stream with a reset. On a bulk lane a sender's graceful end is a frame of
// its own, 0x02 0x00, before yamux's FIN, so that a lane lost under a
// stream is told from its end. QUIC streams carry the bytes unframed and
// reset with RESET_STREAM and STOP_SENDING.
//
// Parity packets travel beside the QUIC packets on the same UDP socket and
// are told apart by their first byte, 0x21, which has QUIC's fixed bit
// clear; their layout is described at fecConn.
//
// Error codes: connections close with 0x000 (normal), 0x101 (replaced by a
// newer connection), 0x102 (refused: draining), 0x103 (protocol), 0x104
// (identity), 0x105 (hub shutting down); streams reset with 0x201 (closed
// unread), 0x202 (dial failed), 0x203 (dial timed out), 0x204 (too many
// streams), 0x205 (local end failed), 0x206 (bad preamble), 0x207 (the
// bulk lane carrying the stream was lost).
package tunnel
