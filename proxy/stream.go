package proxy

import (
	"errors"
	"io"
	"net"
	"sync/atomic"

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

	state   int
	end     error  // what Read returns once the replica's body is over
	pending string // an in-band SSE error event still to send
	closed  bool
	listed  bool        // in p.streams, from the first Read to CloseWithError
	cutReq  atomic.Bool // set by CutStreams, from another goroutine
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
		if s.sse {
			s.p.observeUsage(s.o, b[:n])
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
		s.state = streamFailed
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
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	buf := *bp
	var total int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
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
// body ended (writeErr from the client side, or a response never written)
// means the client went away.
func (s *streamRelay) CloseWithError(error) error {
	if s.closed {
		return nil
	}
	s.closed = true
	o := s.o
	clientGone := s.state == streaming
	if clientGone {
		o.err = "client_gone"
		o.status = 499
	}
	if clientGone || s.state == streamFailed || s.state == streamCut {
		// Close the connection rather than pool it, so the engine stops generating.
		s.resp.SetConnectionClose()
	}
	_ = s.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(s.resp)
	s.release()
	s.dec.Started()
	if s.state == streamFailed {
		s.dec.Replica.ReportFailure(errors.New("stream interrupted"))
	}
	s.p.finish(o)
	if s.listed {
		// After finish, so CutStreams returns once the access log has the line.
		s.p.streams.remove(s, s.state == streamCut)
	}
	return nil
}
