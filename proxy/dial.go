package proxy

import (
	"net"
	"sync/atomic"
	"time"
)

// Dialer returns a dial function for replica connections that enforces the
// forwarding path's two timeouts on the connection itself: after a request is
// written, the replica has firstByte to start its response; after that, each
// read may wait at most idle. fasthttp's own client timeouts cover a whole
// response and would cut long generations, so they stay off (STYLE.md,
// fasthttp pitfall 4).
func Dialer(connect, firstByte, idle time.Duration) func(addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}
	return func(addr string) (net.Conn, error) {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			return nil, err
		}
		return &timedConn{Conn: c, firstByte: firstByte, idle: idle}, nil
	}
}

// timedConn sets a read deadline before every read: firstByte while a
// written request awaits its first response byte, idle afterwards.
type timedConn struct {
	net.Conn
	firstByte time.Duration
	idle      time.Duration
	awaiting  atomic.Bool // a request was written and no response byte read yet
}

func (c *timedConn) Write(p []byte) (int, error) {
	c.awaiting.Store(true)
	return c.Conn.Write(p)
}

func (c *timedConn) Read(p []byte) (int, error) {
	wait := c.idle
	if c.awaiting.Load() {
		wait = c.firstByte
	}
	if wait > 0 {
		if err := c.Conn.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return 0, err
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.awaiting.Store(false)
	}
	return n, err
}
