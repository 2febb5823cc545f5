package proxy

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/oai"
)

// clientPollEvery is how often the watches ask whether their clients are
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
// request). One goroutine peeks for every watch (watcher), so that a
// queue of thousands of requests costs one timer, not thousands.
type clientWatch struct {
	ctx    context.Context
	cancel context.CancelFunc
	gone   atomic.Bool

	mu      sync.Mutex // held by a peek and by Stop: no peek after Stop
	conn    net.Conn
	stopped bool
}

// watching counts the watches running, for the tests.
var watching atomic.Int64

// watcher is the goroutine that peeks for every watch, running while
// there is one.
var watcher struct {
	mu      sync.Mutex
	watches map[*clientWatch]struct{}
	running bool
}

// watchClient starts watching conn.
func watchClient(conn net.Conn) *clientWatch {
	w := &clientWatch{conn: conn}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	watching.Add(1)
	watcher.mu.Lock()
	if watcher.watches == nil {
		watcher.watches = map[*clientWatch]struct{}{}
	}
	watcher.watches[w] = struct{}{}
	if !watcher.running {
		watcher.running = true
		go runWatcher()
	}
	watcher.mu.Unlock()
	return w
}

// runWatcher peeks at every watched connection each clientPollEvery, and
// ends once no watch is left.
func runWatcher() {
	t := time.NewTicker(clientPollEvery)
	defer t.Stop()
	var batch []*clientWatch
	for range t.C {
		watcher.mu.Lock()
		if len(watcher.watches) == 0 {
			watcher.running = false
			watcher.mu.Unlock()
			return
		}
		batch = batch[:0]
		for w := range watcher.watches {
			batch = append(batch, w)
		}
		watcher.mu.Unlock()
		for _, w := range batch {
			w.peek()
		}
		clear(batch) // keep no watch alive
	}
}

// peek asks once whether the client closed its connection.
func (w *clientWatch) peek() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.gone.Load() || !peerClosed(w.conn) {
		return
	}
	w.gone.Store(true)
	w.cancel()
	watcher.mu.Lock()
	delete(watcher.watches, w)
	watcher.mu.Unlock()
}

// Context is done once the client has gone.
func (w *clientWatch) Context() context.Context { return w.ctx }

// Gone reports whether the client has closed its connection.
func (w *clientWatch) Gone() bool { return w.gone.Load() }

// Stop ends the watch: no peek at its connection runs after it returns.
// Safe on a nil watch; call once.
func (w *clientWatch) Stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	w.conn = nil
	w.mu.Unlock()
	watcher.mu.Lock()
	delete(watcher.watches, w)
	watcher.mu.Unlock()
	watching.Add(-1)
	// The context stays as it is: an SGLang prefill still in flight when
	// the handler returns runs on (pairing.stop).
}
