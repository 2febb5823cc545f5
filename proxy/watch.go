package proxy

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/oai"
)

// clientPollEvery is how often a clientWatch asks whether its client is
// still connected.
const clientPollEvery = 50 * time.Millisecond

// errClientLeft is the answer, never read, of a request whose client
// went away while it waited (a prefill, the flow queue: clientWatch).
var errClientLeft = oai.NewError(statusClientGone, "invalid_request_error", codeClientGone,
	"the client closed the connection before its answer")

// clientWatch follows a client's connection while its request waits on
// something that does not read from it (a prefill, the flow queue): every
// clientPollEvery a non-blocking peek, as nginx checks a client while it
// waits on a replica. Once the client has closed the connection, Context
// is done and Gone reports it. Stop ends the watch; it must be called
// before the handler returns (the connection then serves its next
// request).
type clientWatch struct {
	ctx    context.Context
	cancel context.CancelFunc
	stop   chan struct{}
	done   chan struct{}
	gone   atomic.Bool
}

// watching counts the watches running, for the tests.
var watching atomic.Int64

// watchClient starts watching conn.
func watchClient(conn net.Conn) *clientWatch {
	w := &clientWatch{stop: make(chan struct{}), done: make(chan struct{})}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	watching.Add(1)
	go func() {
		defer watching.Add(-1)
		defer close(w.done)
		t := time.NewTicker(clientPollEvery)
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				if peerClosed(conn) {
					w.gone.Store(true)
					w.cancel()
					return
				}
			}
		}
	}()
	return w
}

// Context is done once the client has gone.
func (w *clientWatch) Context() context.Context { return w.ctx }

// Gone reports whether the client has closed its connection.
func (w *clientWatch) Gone() bool { return w.gone.Load() }

// Stop ends the watch and waits for it. Safe on a nil watch; call once.
func (w *clientWatch) Stop() {
	if w == nil {
		return
	}
	close(w.stop)
	<-w.done
}
