package backends

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/sockio"
)

// dialer dials the connections of a replica's clients, proxied traffic and
// checks alike, and is the one place where TLS is set up: the dial is
// capped at connect (or the request's remaining time, if shorter) and,
// when tls returns a configuration (https), includes the TLS handshake
// with it; fasthttp would otherwise run the handshake on first write with
// no deadline, since the proxy client has no write timeout. Every
// connection gets a strayGuard over its plaintext, which calls onStray
// when the replica sent bytes outside an answer. A dialer with timeouts
// (the proxy client's) also checks response heads (framer.checkHeads) and
// puts its read deadlines on the connection (timedConn).
type dialer struct {
	connect time.Duration
	tls     func() *tls.Config
	// raw dials the TCP connection: Options.Dial for the proxy client,
	// else the built-in dual-stack dialer.
	raw      func(addr string, timeout time.Duration) (net.Conn, error)
	onStray  func()
	timeouts *readTimeouts // nil: no read deadlines, no head checks (checks)
}

// Dial has the signature of fasthttp.DialFuncWithTimeout.
func (d *dialer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	if timeout <= 0 || timeout > d.connect {
		timeout = d.connect
	}
	deadline := time.Now().Add(timeout)
	conn, err := d.raw(addr, timeout)
	if err != nil {
		return nil, err
	}
	// Below TLS and the guards: the socket's own reads and writes.
	conn = sockio.Wrap(conn)
	cfg := d.tls()
	if cfg == nil {
		return d.wrap(newStrayGuard(conn, nil, conn, d.onStray)), nil
	}
	// The connection's deadline bounds the handshake: fasthttp's dial
	// function has no context to hand on, and a context deadline would
	// cost a goroutine per handshake to watch it.
	tc := tls.Client(conn, cfg)
	_ = tc.SetDeadline(deadline)
	if err := tc.HandshakeContext(context.Background()); err != nil {
		_ = conn.Close()
		return nil, err
	}
	_ = tc.SetDeadline(time.Time{})
	return wrappedTLS{Conn: d.wrap(newStrayGuard(tc, tc, conn, d.onStray)), tc: tc}, nil
}

// wrap adds the dialer's head checks and read deadlines, if it has
// timeouts, to g. Over TLS, g guards the TLS connection once its handshake
// is done: the deadlines then wait for response bytes, not for TLS records
// such as the session tickets a server sends after the handshake, which
// would otherwise end the first-byte wait early.
func (d *dialer) wrap(g *strayGuard) net.Conn {
	if d.timeouts == nil {
		return g
	}
	g.fr.checkHeads = true
	c := &timedConn{Conn: g, t: d.timeouts}
	c.register()
	return c
}

// wrappedTLS is a TLS connection wrapped by a strayGuard (and a
// timedConn). Its Handshake method tells fasthttp the connection speaks
// TLS already (it runs a TLS client over any connection of an https
// HostClient that has none).
type wrappedTLS struct {
	net.Conn
	tc *tls.Conn
}

// Handshake returns at once: Dial did the handshake.
func (w wrappedTLS) Handshake() error { return w.tc.HandshakeContext(context.Background()) }

// readTimeouts are the proxy client's two read timeouts, shared by a
// fleet's replicas ([Options.FirstByteTimeout], [Options.StreamIdleTimeout],
// [Fleet.SetTimeouts]). They may change while connections are open; each
// read uses the current values.
type readTimeouts struct {
	firstByte atomic.Int64
	idle      atomic.Int64
}

func newReadTimeouts(firstByte, idle time.Duration) *readTimeouts {
	t := &readTimeouts{}
	t.set(firstByte, idle)
	return t
}

func (t *readTimeouts) set(firstByte, idle time.Duration) {
	t.firstByte.Store(int64(firstByte))
	t.idle.Store(int64(idle))
}

func (t *readTimeouts) get() (firstByte, idle time.Duration) {
	return time.Duration(t.firstByte.Load()), time.Duration(t.idle.Load())
}

// timedConn enforces the forwarding path's two timeouts on a proxied
// connection: after a request is written, the replica has the first-byte
// timeout to start its answer; after that, each read may wait at most the
// idle timeout. fasthttp's own client timeouts cover a whole response and
// would cut long generations, so they stay off. It sets a read deadline
// before every read: the first-byte timeout while a written request awaits
// its first response byte, the idle timeout afterwards.
type timedConn struct {
	net.Conn
	t        *readTimeouts
	awaiting atomic.Bool // a request was written and no response byte read yet
	// The read deadline last set and the wait it was set for. Reads of a
	// connection are sequential (one request at a time, handed over
	// through the client's pool).
	deadline time.Time
	wait     time.Duration
	laddr    net.Addr // listed for TakeBody under this address (taken.go), or nil
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaiting.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	wait := time.Duration(c.t.idle.Load())
	awaiting := c.awaiting.Load()
	if awaiting {
		wait = time.Duration(c.t.firstByte.Load())
	}
	if err := c.setDeadline(wait); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting.Store(false)
	}
	return n, err
}

// DeadlineSlack is the fraction of a wait by which a read of a proxied
// connection may time out early: 1/DeadlineSlack.
const DeadlineSlack = 64

// setDeadline makes the read deadline now+wait (none for wait <= 0), but
// keeps the deadline set before for the same wait when it is at most
// wait/DeadlineSlack earlier: a stream's reads, milliseconds apart, or the
// requests of a busy connection then share one deadline instead of each
// reprogramming the runtime's timer, and a read still times out within
// [wait − wait/DeadlineSlack, wait].
func (c *timedConn) setDeadline(wait time.Duration) error {
	if wait <= 0 {
		if c.wait <= 0 {
			return nil
		}
		c.deadline, c.wait = time.Time{}, 0
		return c.SetReadDeadline(time.Time{})
	}
	want := time.Now().Add(wait)
	if wait == c.wait && want.Sub(c.deadline) <= wait/DeadlineSlack {
		return nil
	}
	c.deadline, c.wait = want, wait
	return c.SetReadDeadline(want)
}
