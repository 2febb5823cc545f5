package proxy

import (
	"net"
	"runtime"
	"sync/atomic"
	"time"
)

// Dialer dials replica connections that enforce the forwarding path's two
// timeouts on the connection itself: after a request is written, the
// replica has FirstByte to start its response; after that, each read may
// wait at most Idle. fasthttp's own client timeouts cover a whole response
// and would cut long generations, so they stay off. The timeouts can be
// changed while connections are open (a configuration reload); each read
// uses the current values.
type Dialer struct {
	d         net.Dialer
	firstByte atomic.Int64
	idle      atomic.Int64
}

// NewDialer builds a Dialer with the given timeouts.
func NewDialer(connect, firstByte, idle time.Duration) *Dialer {
	d := &Dialer{d: net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}}
	d.SetTimeouts(firstByte, idle)
	return d
}

// SetTimeouts changes the time-to-first-byte and stream-idle timeouts.
func (d *Dialer) SetTimeouts(firstByte, idle time.Duration) {
	d.firstByte.Store(int64(firstByte))
	d.idle.Store(int64(idle))
}

// Dial connects to addr; it has the signature of fasthttp.DialFunc.
func (d *Dialer) Dial(addr string) (net.Conn, error) {
	c, err := d.d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return d.Wrap(c), nil
}

// Wrap puts the dialer's timeouts on an established connection; it has the
// signature of backends.Options.WrapConn. Over TLS, c is the TLS connection
// once its handshake is done: the timeouts then wait for response bytes,
// not for TLS records such as the session tickets a server sends after the
// handshake, which would otherwise end the first-byte wait early. Response
// heads are checked as they arrive (headGuard, forwardcheck.go).
func (d *Dialer) Wrap(c net.Conn) net.Conn { return &timedConn{Conn: newHeadGuard(c), d: d} }

// timedConn sets a read deadline before every read: the first-byte timeout
// while a written request awaits its first response byte, the idle timeout
// afterwards.
type timedConn struct {
	net.Conn
	d        *Dialer
	awaiting atomic.Bool // a request was written and no response byte read yet
	// The read deadline last set and the wait it was set for. Reads of a
	// connection are sequential (one request at a time, handed over
	// through the client's pool).
	deadline time.Time
	wait     time.Duration
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaiting.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	wait := time.Duration(c.d.idle.Load())
	awaiting := c.awaiting.Load()
	if awaiting {
		wait = time.Duration(c.d.firstByte.Load())
	}
	if err := c.setDeadline(wait); err != nil {
		return 0, err
	}
	if awaiting {
		// The answer to a request just written is rarely there yet, and
		// reading now would fail with EAGAIN, park the goroutine and wake
		// it through the netpoller. Letting the other runnable requests go
		// first gives the replica that time: under load the read then
		// finds the answer (failed reads fell from 0.8 to 0.1 per request
		// in the small overhead scenario, counted with strace -c); with
		// nothing else to run, Gosched returns at once. A TCP read returns
		// a byte or an error, so this yields once per request.
		runtime.Gosched()
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting.Store(false)
	}
	return n, err
}

// deadlineSlack is the fraction of a wait by which a read may time out
// early: 1/deadlineSlack.
const deadlineSlack = 64

// setDeadline makes the read deadline now+wait (none for wait <= 0), but
// keeps the deadline set before for the same wait when it is at most
// wait/deadlineSlack earlier: a stream's reads, milliseconds apart, or the
// requests of a busy connection then share one deadline instead of each
// reprogramming the runtime's timer, and a read still times out within
// [wait − wait/deadlineSlack, wait].
func (c *timedConn) setDeadline(wait time.Duration) error {
	if wait <= 0 {
		if c.wait <= 0 {
			return nil
		}
		c.deadline, c.wait = time.Time{}, 0
		return c.SetReadDeadline(time.Time{})
	}
	want := time.Now().Add(wait)
	if wait == c.wait && want.Sub(c.deadline) <= wait/deadlineSlack {
		return nil
	}
	c.deadline, c.wait = want, wait
	return c.SetReadDeadline(want)
}
