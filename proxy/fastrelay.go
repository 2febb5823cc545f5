package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/sockio"
)

// A server-sent event stream whose replica answers in chunks over plain
// TCP, to a client on plain TCP, is relayed without fasthttp's client body
// and without a goroutine hand-off per event: its body is taken from the
// replica connection (backends.TakeBody) and a Poller of the proxy's
// (ServeStreams) reads each event as the kernel reports it and writes it
// to the client at once, in the same goroutine, one chunk per read. The
// stream's own goroutine (fasthttp's, in streamRelay.WriteTo) waits
// meanwhile, and takes the stream back when the client cannot take an
// event at once (it then waits for the client as any relay does, up to
// timeouts.client_write), when the replica falls silent for
// timeouts.stream_idle, when CutStreams cuts it, or when the Poller stops.

// pollers are the Pollers streams are spread over, set while ServeStreams runs.
type pollers struct {
	ps   []*sockio.Poller
	next atomic.Uint32
}

// ServeStreams serves the Pollers that relay taken streams, one per Go
// processor, until ctx is done. Before it runs, and where the system has
// no Poller (it then returns the error at once), every stream is relayed
// by its own goroutine.
func (p *Proxy) ServeStreams(ctx context.Context) error {
	n := runtime.GOMAXPROCS(0)
	set := &pollers{ps: make([]*sockio.Poller, 0, n)}
	for range n {
		pl, err := sockio.NewPoller()
		if err != nil {
			for _, pl := range set.ps {
				pl.Close()
			}
			return err
		}
		set.ps = append(set.ps, pl)
	}
	p.pollers.Store(set)
	defer p.pollers.CompareAndSwap(set, nil)
	var wg sync.WaitGroup
	for _, pl := range set.ps {
		wg.Go(func() { pl.Run(ctx) })
	}
	wg.Wait()
	return nil
}

// poller returns the Poller for the next stream, or nil.
func (p *Proxy) poller() *sockio.Poller {
	set := p.pollers.Load()
	if set == nil {
		return nil
	}
	return set.ps[int(set.next.Add(1))%len(set.ps)]
}

// nowWriter is a socket written without waiting (sockio.Conn on Linux).
type nowWriter interface {
	WriteNow(p []byte) (int, error)
}

// nowClient returns the plaintext socket under c, the client connection,
// when it writes without waiting; nil over TLS or any other connection.
func nowClient(c net.Conn) nowWriter {
	for {
		switch c.(type) {
		case *tls.Conn, tlsConnState:
			return nil
		}
		if w, ok := c.(nowWriter); ok {
			return w
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
}

// takeStream makes s relay its replica's body itself (fastStream), when
// the Proxy serves Pollers, the client's socket and the replica's allow
// it, and the replica's body is chunked and untouched.
func (p *Proxy) takeStream(s *streamRelay, ctx *fasthttp.RequestCtx) {
	pl := p.poller()
	if pl == nil {
		return
	}
	cw := nowClient(ctx.Conn())
	if cw == nil {
		return
	}
	b := backends.TakeBody(s.resp)
	if b == nil {
		return
	}
	s.fast = &fastStream{s: s, body: b, client: cw, poller: pl, wake: make(chan struct{}, 1)}
	p.polled.Add(1)
	if po, ok := p.obs.(PolledStreamObserver); ok {
		po.PolledStream(s.dec.Replica.Name())
	}
}

// PolledStreamObserver is an Observer that also counts the streams
// relayed by a Poller; the proxy calls it when the Observer implements it.
type PolledStreamObserver interface {
	PolledStream(backend string)
}

// PolledStreams returns the number of streams whose replica body was taken
// and relayed through a Poller (while the client kept up).
func (p *Proxy) PolledStreams() int64 { return p.polled.Load() }

// chunkRoom is the room kept before a read's data for its chunk-size
// line (at most 8 hex digits for a 32 KiB buffer, and CRLF); the CRLF
// after the data takes the buffer's last two bytes.
const chunkRoom = 16

// fastStream is the state of a stream relayed from a taken body. While
// polled, the Poller's goroutine owns it (Ready, under mu); otherwise the
// stream's goroutine does.
type fastStream struct {
	s      *streamRelay
	body   *backends.Body
	client nowWriter
	poller *sockio.Poller
	buf    []byte

	mu     sync.Mutex
	polled bool
	token  sockio.Token
	wake   chan struct{} // a signal to the stream's goroutine: Ready stopped polling, or CutStreams
	reads  atomic.Uint64 // reads that returned bytes, for the idle check

	// What Ready left for the stream's goroutine when it stopped polling.
	unwritten []byte // the end of a chunk the client could not take at once
	readErr   error  // the replica's body ended (io.EOF) or failed
	writeErr  error  // the client's write failed
	written   int64
}

// kick wakes the stream's goroutine (CutStreams).
func (f *fastStream) kick() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// next reads once from the replica's body, waiting or not, and returns
// what came framed as one chunk (nil when only framing came), with the
// read's error: nil, io.EOF at the body's end, sockio.ErrWouldBlock, or
// the failure.
func (f *fastStream) next(now bool) ([]byte, error) {
	s := f.s
	data := f.buf[chunkRoom : len(f.buf)-2]
	var n int
	var err error
	if now {
		n, err = f.body.ReadNow(data)
	} else {
		n, err = f.body.Read(data)
	}
	if n == 0 {
		if err == nil {
			f.reads.Add(1)
		}
		return nil, err
	}
	f.reads.Add(1)
	o := s.o
	if o.ttfb == 0 {
		o.ttfb = time.Since(o.start)
	}
	s.dec.Started()
	o.bytes += int64(n)
	s.p.observeUsage(o, s.dec, data[:n])
	if s.ids != nil && !s.ids.feed(data[:n]) {
		s.ids = nil
	}
	// The chunk-size line goes just before the data, the CRLF after it.
	start := chunkRoom - 2
	copy(f.buf[start:], "\r\n")
	for v := n; ; v >>= 4 {
		start--
		f.buf[start] = "0123456789abcdef"[v&15]
		if v < 16 {
			break
		}
	}
	end := chunkRoom + n
	copy(f.buf[end:], "\r\n")
	return f.buf[start : end+2], err
}

// Ready relays what the replica sent, in the Poller's goroutine.
func (f *fastStream) Ready() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.polled {
		return
	}
	frame, err := f.next(true)
	if len(frame) > 0 {
		k, werr := f.client.WriteNow(frame)
		f.written += int64(k)
		if werr != nil {
			if errors.Is(werr, sockio.ErrWouldBlock) {
				f.unwritten = frame[k:]
			} else {
				f.writeErr = werr
			}
			if err != nil && !errors.Is(err, sockio.ErrWouldBlock) {
				f.readErr = err
			}
			f.stopLocked()
			return
		}
	}
	if err != nil && !errors.Is(err, sockio.ErrWouldBlock) {
		f.readErr = err
		f.stopLocked()
	}
}

// stopLocked ends polling and wakes the stream's goroutine.
func (f *fastStream) stopLocked() {
	if !f.polled {
		return
	}
	f.polled = false
	f.poller.Remove(f.body.Conn(), f.token)
	f.kick()
}

// poll hands the stream to the Poller and waits until it gives it back,
// the replica stays silent past its idle timeout, the stream is cut or
// the Poller stops. It returns false when the stream could not be polled.
func (f *fastStream) poll() bool {
	f.mu.Lock()
	tok, err := f.poller.Add(f.body.Conn(), f)
	if err != nil {
		f.mu.Unlock()
		return false
	}
	f.token, f.polled = tok, true
	f.mu.Unlock()

	// The idle timeout is checked every quarter of it, so a silent replica
	// is cut after between 1 and 1.25 times it: a stream's goroutine
	// wakes rarely (every 15 s with the default 60 s), however many
	// events pass.
	idle := f.body.IdleTimeout()
	var tick <-chan time.Time
	if idle > 0 {
		t := time.NewTicker(max(idle/4, time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	seen, since := f.reads.Load(), time.Now()
	silent := false
	for {
		select {
		case <-f.wake:
		case <-f.poller.Done():
		case now := <-tick:
			if r := f.reads.Load(); r != seen {
				seen, since = r, now
			}
			if silent = now.Sub(since) >= idle; !silent {
				continue
			}
		}
		break
	}
	f.mu.Lock()
	if silent && f.polled && f.readErr == nil {
		f.readErr = errIdle
	}
	f.stopLocked()
	f.mu.Unlock()
	return true
}

// errIdle fails a polled stream whose replica sent nothing for its idle
// timeout, as a read deadline would.
var errIdle = &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}

// relay relays the stream to w's connection until the replica's body ends
// or fails or the client fails: polled while the client keeps up, else
// from this goroutine. It returns the client's write error, if any.
func (f *fastStream) relay(w io.Writer) (int64, error) {
	s := f.s
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	f.buf = *bp
	polling := true
	for {
		if len(f.unwritten) > 0 {
			s.armWrite()
			k, err := s.clientConn.Write(f.unwritten)
			f.written += int64(k)
			f.unwritten = nil
			if err != nil {
				return f.written, err
			}
		}
		if f.writeErr != nil {
			return f.written, f.writeErr
		}
		if f.readErr == nil && s.cutReq.Load() {
			f.readErr = errStreamCut
		}
		if f.readErr != nil {
			return f.end(w)
		}
		now := polling
		frame, err := f.next(now)
		if now && frame == nil && errors.Is(err, sockio.ErrWouldBlock) {
			// Nothing held or waiting: the Poller tells when more comes.
			if polling = f.poll(); polling {
				continue
			}
			frame, err = f.next(false)
		}
		if len(frame) > 0 {
			f.unwritten = frame
		}
		if err != nil {
			f.readErr = err
		}
	}
}

// end settles the stream's state from the read error that ended it, and
// writes the final event of a stream that failed or was cut.
func (f *fastStream) end(w io.Writer) (int64, error) {
	s := f.s
	// For this event and the last chunk fasthttp writes: the deadline
	// set before was not moved while the Poller wrote.
	s.armWrite()
	switch {
	case errors.Is(f.readErr, io.EOF):
		s.state, s.end = streamDone, io.EOF
		return f.written, nil
	case s.cutReq.Load():
		s.endCut()
	default:
		s.state, s.failErr = streamFailed, f.readErr
		s.o.err = "stream_interrupted"
		s.pending, s.end = streamErrorEvent(s.dec.Replica.Name()), io.EOF
	}
	k, err := io.WriteString(w, s.pending)
	s.pending = ""
	return f.written + int64(k), err
}

// finish hands the replica connection back: to the pool when the body
// ended, else closed.
func (f *fastStream) finish() {
	s := f.s
	if s.state != streamDone || !f.body.Finish(s.resp.BodyStream()) {
		s.resp.SetConnectionClose()
	}
}
