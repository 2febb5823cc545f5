package proxy

import (
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/router"
)

// errStreamInterrupted ends a relayed non-SSE body whose replica failed
// mid-way: fasthttp then leaves the chunked body unterminated.
var errStreamInterrupted = errors.New("replica stopped sending before the body ended")

// Stream states.
const (
	streaming    = iota // more may come from the replica
	streamDone          // the replica's body ended cleanly
	streamFailed        // the replica failed mid-body
	streamCut           // CutStreams ended it (drain.go)
)

// streamRelay is the body stream of a relayed stream (server-sent events, or
// a body of unknown length). fasthttp's server reads it in the client
// connection's own goroutine and sends every piece as one chunk, flushed at
// once, so an event costs one read from the replica and one write to the
// client. It settles the attempt (replica connection, in-flight count,
// decision, access log) exactly once, in CloseWithError, which fasthttp calls
// when the response is written or dropped.
type streamRelay struct {
	p          *Proxy
	o          *outcome
	resp       *fasthttp.Response
	body       io.Reader
	release    func()
	dec        *router.Decision
	sse        bool
	clientConn net.Conn
	ids        *responseIDScanner // watches for a created response's id (responses.go), or nil
	key        router.KeyHold     // the request's routing key, for dec.Feedback

	state   int
	end     error  // what Read returns once the replica's body is over
	pending string // an in-band SSE error event still to send
	failErr error  // the replica body's read error, when streamFailed
	closed  bool
	listed  bool        // in p.streams, from the first Read to CloseWithError
	cutReq  atomic.Bool // set by CutStreams, from another goroutine

	// Each write to the client must complete within writeWait; the write
	// deadline last set is writeDeadline (see armWrite).
	writeWait     time.Duration
	writeDeadline time.Time
	keepHead      bool   // keep the body's first maxIDEvent bytes in head, for noteResponse
	head          []byte // those bytes

	fast *fastStream // the replica's body taken and relayed by a Poller (fastrelay.go), or nil
}

// Read returns the next bytes of the replica's body. When the replica fails
// mid-stream, an SSE body gets an error event and ends cleanly; any other
// body ends with errStreamInterrupted and the client connection is closed,
// since a truncated body must not look complete.
func (s *streamRelay) Read(b []byte) (int, error) {
	if s.pending != "" {
		n := copy(b, s.pending)
		s.pending = s.pending[n:]
		return n, nil
	}
	if s.state != streaming {
		return 0, s.end
	}
	if !s.listed {
		s.listed = true
		s.p.streams.add(s)
	}
	if s.cutReq.Load() {
		s.endCut()
		return s.Read(b)
	}
	n, err := s.body.Read(b)
	if n > 0 {
		s.dec.Started()
		s.o.bytes += int64(n)
		if s.keepHead && len(s.head) < maxIDEvent {
			s.head = append(s.head, b[:min(n, maxIDEvent-len(s.head))]...)
		}
		if s.sse {
			s.p.observeUsage(s.o, s.dec, b[:n])
		}
		if s.ids != nil && !s.ids.feed(b[:n]) {
			s.ids = nil
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		s.state, s.end = streamDone, io.EOF
	case s.cutReq.Load():
		s.endCut()
	default:
		s.state, s.failErr = streamFailed, err
		s.o.err = "stream_interrupted"
		if s.sse {
			// Tell the client in-band: the headers are gone already.
			s.pending, s.end = streamErrorEvent(s.dec.Replica.Name()), io.EOF
		} else {
			_ = s.clientConn.Close()
			s.end = errStreamInterrupted
		}
	}
	if n == 0 && s.state != streaming {
		return s.Read(b)
	}
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to use WriteTo, which reads into a
// larger buffer than fasthttp's own.
func (s *streamRelay) SupportsBodyWriteTo() bool { return true }

// WriteTo copies the stream to w, which fasthttp frames and flushes per
// Write. It has exactly Read's effects.
func (s *streamRelay) WriteTo(w io.Writer) (int64, error) {
	if s.fast != nil {
		if !s.listed {
			s.listed = true
			s.p.streams.add(s)
		}
		return s.fast.relay(w)
	}
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
			s.armWrite()
			if _, werr := w.Write(buf[:n]); werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if errors.Is(err, io.EOF) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// CloseWithError settles the attempt. A stream closed before the replica's
// body ended, or whose last write failed (writeErr from the client side, or
// a response never written), did not reach its client: one that stopped
// reading for timeouts.client_write is logged with error
// client_write_timeout and the status it was sent, one that went away as
// 499 client_gone. Neither is the replica's fault.
func (s *streamRelay) CloseWithError(writeErr error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	o := s.o
	clientLost := s.state == streaming || s.state == streamDone && writeErr != nil
	if clientLost {
		if isTimeout(writeErr) {
			o.err = "client_write_timeout"
			s.p.countSlowCut(o)
		} else {
			o.err = codeClientGone
			o.status = statusClientGone
		}
	}
	if s.state == streamDone && s.keepHead {
		s.p.noteResponse(o.ctx, s.dec.Replica, o.status, s.head)
	}
	if s.state != streamDone {
		// Close the connection rather than pool it, so the engine stops generating.
		s.resp.SetConnectionClose()
	}
	if s.fast != nil {
		s.fast.finish()
	}
	_ = s.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(s.resp)
	if s.state == streamFailed {
		// Counted only when the read error is the replica's doing, not
		// a connection kvroute closed itself (backends.IsReplicaFault);
		// before the in-flight slot goes, so that a replica seen idle
		// has its failures counted.
		s.dec.Replica.ReportFailure(streamFault(s.failErr))
	}
	s.release()
	s.dec.Started()
	s.key.Drop()
	s.p.finish(o)
	if s.listed {
		// After finish, so CutStreams returns once the access log has the line.
		s.p.streams.remove(s, s.state == streamCut)
	}
	return nil
}

// armWrite moves the client connection's write deadline to
// now+writeWait before a write, unless the one set before is at most
// writeWait/deadlineSlack earlier (as backends' timed connection does for
// replica reads): a stream's writes, milliseconds apart, share one deadline
// instead of each reprogramming the runtime's timer. It is set through the
// request's ctx, so fasthttp clears it once the response is written.
func (s *streamRelay) armWrite() {
	if s.writeWait <= 0 {
		return
	}
	want := time.Now().Add(s.writeWait)
	if want.Sub(s.writeDeadline) <= s.writeWait/deadlineSlack {
		return
	}
	s.writeDeadline = want
	_ = s.o.ctx.SetWriteDeadline(want)
}

// isTimeout reports whether err is a deadline that passed.
func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isResponsesPath reports whether path is /v1/responses or below it.
func isResponsesPath(path []byte) bool {
	return len(path) >= len(pathResponses) && string(path[:len(pathResponses)]) == pathResponses
}

// WriteTimeoutObserver is an Observer that also counts the answers cut
// because their client stopped reading for Options.ClientWriteTimeout; the
// proxy calls it when the Observer implements it.
type WriteTimeoutObserver interface {
	ClientWriteTimeout(endpoint, backend string)
}

// ClientWriteTimeouts returns the number of answers cut because their
// client stopped reading for Options.ClientWriteTimeout.
func (p *Proxy) ClientWriteTimeouts() int64 { return p.slowCuts.Load() }

// countSlowCut counts an answer of o cut by the client write timeout.
func (p *Proxy) countSlowCut(o *outcome) {
	p.slowCuts.Add(1)
	if wt, ok := p.obs.(WriteTimeoutObserver); ok {
		wt.ClientWriteTimeout(o.endpoint, o.replica)
	}
}

// heldBody is the body stream of an answer read whole (relay): it hands
// fasthttp the bytes and gives up the request's in-flight place (and what
// flow control holds for it) once they
// are written or the write failed, so limits.max_inflight also bounds the
// buffered answers held for clients that do not read them. The request is
// recorded before, when the answer is handed over; a write cut by the
// client write timeout is counted here (ClientWriteTimeouts), though its
// access-log line already went out.
type heldBody struct {
	p    *Proxy
	o    *outcome
	b    []byte
	done bool
}

func (h *heldBody) Read(b []byte) (int, error) {
	if len(h.b) == 0 {
		return 0, io.EOF
	}
	n := copy(b, h.b)
	h.b = h.b[n:]
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to use WriteTo: the body in one Write.
func (h *heldBody) SupportsBodyWriteTo() bool { return true }

func (h *heldBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(h.b)
	h.b = h.b[n:]
	return int64(n), err
}

// CloseWithError gives up the in-flight place; fasthttp calls it once the
// response is written or dropped.
func (h *heldBody) CloseWithError(writeErr error) error {
	if h.done {
		return nil
	}
	h.done = true
	h.b = nil
	if isTimeout(writeErr) {
		h.p.countSlowCut(h.o)
	}
	h.p.leave(h.o)
	return nil
}
