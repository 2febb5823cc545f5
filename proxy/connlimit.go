package proxy

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/oai"
)

// The connection cap (limits.max_connections) is enforced here rather than
// by fasthttp's Concurrency, whose answer is a plain-text 503 written by its
// accept loop, without Retry-After and out of sight of the access log and
// metrics. LimitListener counts the connections it hands to the server; one
// over the cap is answered by a rejecter of its own, which reads what
// arrives of the request head for a moment (so the log line can name the
// method and path, and so closing does not reset a connection with unread
// bytes, which would lose the answer), writes a whole HTTP/1.1 503 with an
// OpenAI error body and closes it. Wrapped around a TLS listener it answers
// over TLS, the handshake bounded by the same deadline.

const (
	// rejectTimeout bounds the TLS handshake and reading the request head
	// of a rejection, and, again, writing its answer.
	rejectTimeout = time.Second
	// rejectHeadBytes bounds what a rejection reads of the request head.
	rejectHeadBytes = 4096
	// rejectLinger is how long, after the answer, a rejection keeps
	// reading (and discarding, at most rejectLingerBytes) what the client
	// still sends, waiting for it to close first.
	rejectLinger      = 500 * time.Millisecond
	rejectLingerBytes = 64 << 10
	// maxRejecters bounds the rejections running at once; past it the
	// listener accepts nothing until one ends, leaving further connections
	// in the kernel's queue rather than in memory.
	maxRejecters = 64
)

// LimitListener returns ln with the proxy's connection cap
// (Options.MaxConnections, as built) applied to the connections it accepts;
// the count is shared by every listener the proxy wraps. Connections under
// the cap are returned to the caller, counted until their first Close.
// Those over it are answered by the listener itself: 503, code
// too_many_connections, with Retry-After and Connection: close, one
// access-log line and one request sample each. Wrap after TLS, so that the
// answer is written over it.
func (p *Proxy) LimitListener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, p: p, max: int64(p.opts.MaxConnections),
		slots: make(chan struct{}, maxRejecters), done: make(chan struct{})}
}

// OpenConns returns the client connections open on the proxy's limited
// listeners.
func (p *Proxy) OpenConns() int64 { return p.conns.Load() }

type limitListener struct {
	net.Listener
	p         *Proxy
	max       int64
	slots     chan struct{} // one per rejection running
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.p.conns.Add(1) <= l.max {
			return countConn(c, &l.p.conns), nil
		}
		l.p.conns.Add(-1)
		select {
		case l.slots <- struct{}{}:
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
		go func() {
			defer func() { <-l.slots }()
			l.p.rejectConn(c)
		}()
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// countedConn is a connection under the cap: its first Close counts it out.
type countedConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
	// remote is the client's address as the access log writes it, and
	// remoteIP its IP as X-Forwarded-For does: worked out once per
	// connection rather than once per request.
	remote, remoteIP string
}

// tlsConnState is what fasthttp asks of a connection to treat it as TLS.
type tlsConnState interface {
	Handshake() error
	ConnectionState() tls.ConnectionState
}

// countedTLSConn keeps a TLS connection's methods visible through the
// wrapper, so that fasthttp still sees it as TLS.
type countedTLSConn struct {
	*countedConn
	tc tlsConnState
}

func (c countedTLSConn) Handshake() error                     { return c.tc.Handshake() }
func (c countedTLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

func countConn(c net.Conn, open *atomic.Int64) net.Conn {
	ra := c.RemoteAddr()
	cc := &countedConn{Conn: c, open: open, remote: ra.String()}
	if a, ok := ra.(*net.TCPAddr); ok {
		cc.remoteIP = a.IP.String()
	}
	if tc, ok := c.(tlsConnState); ok {
		return countedTLSConn{countedConn: cc, tc: tc}
	}
	return cc
}

// Close closes the connection; the first call counts it out. fasthttp
// closes every connection it served, and a stream relay may close it
// before (drain.go, stream.go): the count moves once.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return err
}

// NetConn returns the wrapped connection (peerClosed looks through it).
func (c *countedConn) NetConn() net.Conn { return c.Conn }

// rejectConn answers a connection over the cap and closes it. A TLS
// handshake that fails or times out ends it without an answer or a log
// line, as it does under the cap.
func (p *Proxy) rejectConn(c net.Conn) {
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("connection rejection panicked", zap.Any("panic", r))
		}
		_ = c.Close()
	}()
	start := time.Now()
	if c.SetDeadline(start.Add(rejectTimeout)) != nil {
		return
	}
	if tc, ok := c.(tlsConnState); ok {
		if tc.Handshake() != nil {
			return
		}
	}
	ctx := new(fasthttp.RequestCtx)
	ctx.Init(&fasthttp.Request{}, c.RemoteAddr(), zapPrintf{p.log})
	parsed := readHead(c, &ctx.Request.Header)

	o := p.newOutcome(ctx, start)
	if !parsed {
		o.method, o.path = "", "" // the defaults of an empty header, not the request
	}
	o.ctx = nil // answered here, not by fasthttp: record must not finish it
	e := oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "too_many_connections",
		"kvroute is at limits.max_connections client connections; retry later")
	writeError(ctx, e)
	ctx.SetConnectionClose()
	ctx.Response.Header.Set(headerRequestID, o.id)
	ctx.Response.Header.Set(fasthttp.HeaderServer, "kvroute")
	bw := bufio.NewWriterSize(c, 1024)
	err := c.SetWriteDeadline(time.Now().Add(rejectTimeout))
	if err == nil {
		err = ctx.Response.Write(bw)
	}
	if err == nil {
		err = bw.Flush()
	}
	o.status, o.err = e.Status, e.Code
	if err != nil {
		o.status, o.err = statusClientGone, codeClientGone
	} else {
		o.bytes = int64(len(ctx.Response.Body()))
	}
	p.record(o)
	if err == nil {
		linger(c)
	}
}

// readHead reads the request head from c, up to rejectHeadBytes, until the
// connection's deadline, and parses what came into h: the whole head, or
// the request line alone when only that arrived. It reports whether h now
// holds the request's method and target.
func readHead(c net.Conn, h *fasthttp.RequestHeader) bool {
	buf := make([]byte, 0, rejectHeadBytes)
	for len(buf) < cap(buf) && !bytes.Contains(buf, []byte("\r\n\r\n")) {
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err != nil {
			break
		}
	}
	var head []byte
	if end := bytes.Index(buf, []byte("\r\n\r\n")); end >= 0 {
		head = buf[:end+4]
	} else if end := bytes.Index(buf, []byte("\r\n")); end >= 0 {
		head = append(buf[:end+2:end+2], "\r\n"...)
	} else {
		return false
	}
	if h.Read(bufio.NewReader(bytes.NewReader(head))) != nil {
		h.Reset()
		return false
	}
	return true
}

// linger ends the answer's side of c (a FIN, or TLS's close_notify) and
// reads and discards what the client still sends, for a bounded time and
// size, so that the close that follows does not reset a connection with
// unread bytes, which can lose the answer before the client reads it.
func linger(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	if c.SetReadDeadline(time.Now().Add(rejectLinger)) != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, rejectLingerBytes)
}
