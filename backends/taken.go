package backends

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/sockio"
)

// ErrBadChunking is a taken body's read error when the replica's chunked
// framing could not be followed.
var ErrBadChunking = errors.New("replica sent a malformed chunked body")

// takeable maps the local address of every open proxied plaintext
// connection (a *net.TCPAddr, the same value each time the connection is
// asked) to its timedConn, so that TakeBody finds the connection of a
// response, which fasthttp knows by its addresses only.
var takeable sync.Map

// register lists c for TakeBody; its Close unlists it.
func (c *timedConn) register() {
	if g, ok := c.Conn.(*strayGuard); ok && g.tc == nil && g.sock != nil {
		g.holds = true
		c.laddr = c.LocalAddr()
		takeable.Store(c.laddr, c)
	}
}

func (c *timedConn) Close() error {
	if c.laddr != nil {
		takeable.CompareAndDelete(c.laddr, c)
	}
	return c.Conn.Close()
}

// Body is the rest of a replica's chunked answer, read straight from its
// connection instead of through fasthttp's client: its reads return the
// chunks' data only, and ReadNow reads without waiting, for a caller that
// learns of the socket's bytes from a sockio.Poller. One goroutine at a
// time reads it.
type Body struct {
	c    *timedConn
	g    *strayGuard
	done bool
}

// TakeBody returns the body of resp, an answer streamed by a replica's
// proxy client (Replica.Client) whose head has just been read, when it
// can be read straight from the connection: a plaintext socket, a chunked
// body, nothing of it read yet. Else it returns nil and fasthttp's body
// stream stays the way to read it. Once taken, the body must be read
// through the Body only, and Finish called before the response's body
// stream is closed.
func TakeBody(resp *fasthttp.Response) *Body {
	addr := resp.LocalAddr()
	if addr == nil {
		return nil
	}
	v, ok := takeable.Load(addr)
	if !ok {
		return nil
	}
	c := v.(*timedConn)
	g := c.Conn.(*strayGuard)
	if !g.fresh {
		return nil
	}
	g.fresh = false
	return &Body{c: c, g: g}
}

// Conn returns the socket, for a sockio.Poller.
func (b *Body) Conn() net.Conn { return b.g.raw }

// IdleTimeout is the longest the replica may stay silent mid-answer
// (Options.StreamIdleTimeout); Read enforces it, a caller of ReadNow must.
func (b *Body) IdleTimeout() time.Duration { return time.Duration(b.c.t.idle.Load()) }

// Read reads the next bytes of the body into p and returns the data among
// them (possibly none: framing only). It returns io.EOF once the body has
// ended, io.ErrUnexpectedEOF if the replica closed the connection before,
// ErrBadChunking if the framing could not be followed, and a timeout
// error after the idle timeout.
func (b *Body) Read(p []byte) (int, error) {
	return b.read(p, false)
}

// ReadNow is Read without waiting: sockio.ErrWouldBlock when nothing is
// there yet. It does not apply the idle timeout.
func (b *Body) ReadNow(p []byte) (int, error) {
	return b.read(p, true)
}

// nowReader is a socket that reads without waiting (sockio.Conn on Linux).
type nowReader interface {
	ReadNow(p []byte) (int, error)
}

func (b *Body) read(p []byte, now bool) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	g := b.g
	var n int
	var err error
	switch {
	case len(g.held) > 0:
		n = g.takeHeld(p)
	case now:
		nr, ok := g.raw.(nowReader)
		if !ok {
			return 0, sockio.ErrWouldBlock
		}
		n, err = nr.ReadNow(p)
	default:
		if err = b.c.setDeadline(b.IdleTimeout()); err == nil {
			n, err = g.Conn.Read(p)
		}
	}
	if n == 0 {
		if err == nil || errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	_, data, stray := g.fr.follow(p[:n], true, false)
	if stray {
		g.markStray()
	}
	switch g.fr.state {
	case frIdle:
		b.done = true
		g.used = true
		return data, io.EOF
	case frUnknown, frHead, frRefused:
		return data, ErrBadChunking
	}
	return data, nil
}

// lastChunk is what fasthttp's body stream reads after a taken body ended:
// an empty chunked body of its own.
var lastChunk = []byte("0\r\n\r\n")

// Finish ends a taken body for fasthttp's client: after a body read to its
// end, it lets stream, the response's body stream, see an end of its own
// without reading the connection, so that closing it returns the
// connection to the pool. It returns false when the body did not end (the
// caller must then close the connection: Response.SetConnectionClose).
func (b *Body) Finish(stream io.Reader) bool {
	if !b.done || stream == nil {
		return false
	}
	b.g.replay = lastChunk
	var buf [16]byte
	for range 4 {
		n, err := stream.Read(buf[:])
		if n > 0 {
			return false
		}
		if errors.Is(err, io.EOF) {
			return len(b.g.replay) == 0
		}
		if err != nil {
			return false
		}
	}
	return false
}
