package proxy

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/oai"
)

// errStreamCut closes the replica's side of a stream cut by CutStreams.
var errStreamCut = errors.New("stream cut: the shutdown's drain time ran out")

// drainCutEvent is the last event of an SSE stream cut by CutStreams.
var drainCutEvent = "data: " + string(oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "drain_timeout",
	"kvroute is shutting down and timeouts.drain ran out before this stream ended; retry the request").Body()) + "\n\n"

// streamSet is the registry of a proxy's stream relays between their first
// Read and CloseWithError, so that a shutdown whose drain time ran out can
// end them. The zero value is empty and ready.
type streamSet struct {
	mu      sync.Mutex
	live    map[*streamRelay]fasthttp.ReadCloserWithError // each with the replica's body, nil if it cannot be closed
	cutting bool                                          // CutStreams ran: a stream listed from now on is cut at once
	cut     int                                           // streams that ended by a cut
	empty   chan struct{}                                 // closed by remove when live empties while cutting
}

// add lists s; the relay calls it from its first Read, while the replica's
// response is still its own.
func (ss *streamSet) add(s *streamRelay) {
	body, _ := s.resp.BodyStream().(fasthttp.ReadCloserWithError)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.live == nil {
		ss.live = make(map[*streamRelay]fasthttp.ReadCloserWithError)
	}
	ss.live[s] = body
	if ss.cutting {
		s.cutReq.Store(true) // seen by the Read that listed it, before it reads
	}
}

// remove unlists s once it has settled; wasCut counts it as cut.
func (ss *streamSet) remove(s *streamRelay, wasCut bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.live, s)
	if wasCut {
		ss.cut++
	}
	if ss.cutting && len(ss.live) == 0 && ss.empty != nil {
		close(ss.empty)
		ss.empty = nil
	}
}

// CutStreams ends every stream being relayed, and any that starts later:
// an SSE stream gets a final error event (code drain_timeout) and ends
// cleanly, another stream's client connection is closed. Each cut stream
// settles as any other (its replica connection closed, one access-log line
// with error drain_timeout). CutStreams waits until all of them have
// settled or ctx is done, and returns how many were cut. A shutdown calls
// it once timeouts.drain has run out.
func (p *Proxy) CutStreams(ctx context.Context) int {
	ss := &p.streams
	ss.mu.Lock()
	ss.cutting = true
	type listed struct {
		s    *streamRelay
		body fasthttp.ReadCloserWithError
	}
	relays := make([]listed, 0, len(ss.live))
	for s, body := range ss.live {
		relays = append(relays, listed{s, body})
	}
	wait := make(chan struct{})
	if len(ss.live) == 0 {
		close(wait)
	} else {
		ss.empty = wait
	}
	ss.mu.Unlock()

	for _, l := range relays {
		l.s.cutReq.Store(true)
		// A relay blocked reading the replica wakes up: fasthttp's
		// streamed client body may be closed while a Read is in flight,
		// which it interrupts by closing the replica connection. The
		// relay's own close of it later is a no-op.
		if l.body != nil {
			_ = l.body.CloseWithError(errStreamCut)
		}
		if l.s.fast != nil {
			l.s.fast.kick() // a polled stream's goroutine waits for this, not for a read
		}
	}
	select {
	case <-wait:
	case <-ctx.Done():
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.cut
}

// Streams returns the number of streams being relayed.
func (p *Proxy) Streams() int {
	p.streams.mu.Lock()
	defer p.streams.mu.Unlock()
	return len(p.streams.live)
}

// InFlight returns the number of requests between arrival and the last
// byte of their answer written to the client (or the write failed),
// streams and buffered answers included.
func (p *Proxy) InFlight() int64 { return p.inflight.Load() }

// endCut ends a stream that CutStreams cut: the SSE error event, or, for a
// body that cannot carry one, a closed client connection so the truncated
// body does not look complete.
func (s *streamRelay) endCut() {
	s.state = streamCut
	s.o.err = "drain_timeout"
	if s.sse {
		s.pending, s.end = drainCutEvent, io.EOF
		return
	}
	_ = s.clientConn.Close()
	s.end = errStreamInterrupted
}
