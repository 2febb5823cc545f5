package proxy

import (
	"net"
	"sync/atomic"
	"time"
)

// Dialer dials replica connections that enforce the forwarding path's two
// timeouts on the connection itself: after a request is written, the
// replica has FirstByte to start its response; after that, each read may
// wait at most Idle. fasthttp's own client timeouts cover a whole response
// and would cut long generations, so they stay off (STYLE.md, fasthttp
// pitfall 4). The timeouts can be changed while connections are open (a
// configuration reload); each read uses the current values.
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
	return &timedConn{Conn: c, d: d}, nil
}

// timedConn sets a read deadline before every read: the first-byte timeout
// while a written request awaits its first response byte, the idle timeout
// afterwards.
type timedConn struct {
	net.Conn
	d        *Dialer
	awaiting atomic.Bool // a request was written and no response byte read yet
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaiting.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	wait := time.Duration(c.d.idle.Load())
	if c.awaiting.Load() {
		wait = time.Duration(c.d.firstByte.Load())
	}
	if wait > 0 {
		if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting.Store(false)
	}
	return n, err
}
