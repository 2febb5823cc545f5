package runner

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// frontDialTimeout bounds the front's dial of one target: the targets are
// on 127.0.0.1, so a dial that takes longer has failed.
const frontDialTimeout = time.Second

// A front is an L4 TCP balancer on 127.0.0.1, as a Kubernetes Service (or
// any connection-spreading load balancer) is in front of several router
// pods: it hands each accepted client connection to the next target in
// turn and copies bytes both ways, so it spreads connections, not
// requests: every request a client sends on a kept-alive connection goes
// to the target that connection was handed to. A target whose dial fails
// is down from then on and skipped, as a Service drops a dead pod's
// endpoint.
type front struct {
	ln net.Listener
	// ctx ends at Close, canceling the dials in progress.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	next   int
	// targets are the targets' host:port addresses, in turn order; down,
	// handed and pipes are indexed like them.
	targets []string
	down    []bool
	handed  []int
	pipes   []map[*pipe]struct{}
	closed  bool
}

// A pipe is one client connection and its target connection.
type pipe struct {
	client, target net.Conn
}

func (p *pipe) close() {
	_ = p.client.Close()
	_ = p.target.Close()
}

// startFront listens on 127.0.0.1:0 and spreads its connections over
// targets (host:port each).
func startFront(ctx context.Context, targets []string) (*front, error) {
	if len(targets) == 0 {
		return nil, errors.New("front: no target")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &front{ln: ln, targets: targets, down: make([]bool, len(targets)), handed: make([]int, len(targets)),
		pipes: make([]map[*pipe]struct{}, len(targets))}
	for i := range f.pipes {
		f.pipes[i] = map[*pipe]struct{}{}
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.accept()
	return f, nil
}

// Addr is the front's host:port.
func (f *front) Addr() string { return f.ln.Addr().String() }

func (f *front) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.serve(c)
		}()
	}
}

// serve hands client to the next target that accepts a connection and
// relays between them until either side ends; with no target left, it
// closes client.
func (f *front) serve(client net.Conn) {
	for {
		i, addr, ok := f.pick()
		if !ok {
			_ = client.Close()
			return
		}
		d := net.Dialer{Timeout: frontDialTimeout}
		target, err := d.DialContext(f.ctx, "tcp", addr)
		if err != nil {
			f.markDown(i)
			continue
		}
		p := &pipe{client: client, target: target}
		if !f.add(i, p) {
			p.close()
			return
		}
		relay(p)
		f.remove(i, p)
		return
	}
}

// pick returns the next target not down, in turn.
func (f *front) pick() (int, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range f.targets {
		i := f.next
		f.next = (f.next + 1) % len(f.targets)
		if !f.down[i] && !f.closed {
			return i, f.targets[i], true
		}
	}
	return 0, "", false
}

func (f *front) markDown(i int) {
	f.mu.Lock()
	f.down[i] = true
	f.mu.Unlock()
}

// add records p as target i's, unless the front is closed.
func (f *front) add(i int, p *pipe) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.handed[i]++
	f.pipes[i][p] = struct{}{}
	return true
}

func (f *front) remove(i int, p *pipe) {
	f.mu.Lock()
	delete(f.pipes[i], p)
	f.mu.Unlock()
}

// relay copies p's bytes both ways. A client that closes its sending side
// has that passed on to the target; when the target's side ends, or on any
// error, both connections are closed.
func relay(p *pipe) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := io.Copy(p.target, p.client)
		if tc, ok := p.target.(*net.TCPConn); ok && err == nil {
			_ = tc.CloseWrite()
			return
		}
		p.close()
	}()
	_, _ = io.Copy(p.client, p.target)
	p.close()
	<-done
}

// Handed returns how many connections each target was handed, indexed
// like the targets.
func (f *front) Handed() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.handed...)
}

// cut closes every connection relayed to target i, as a crashed pod's
// connections are reset, and returns how many it closed and how many
// target i had been handed. It does not mark the target down: the front
// finds that out at its next dial.
func (f *front) cut(i int) (closed, handed int) {
	f.mu.Lock()
	pipes := make([]*pipe, 0, len(f.pipes[i]))
	for p := range f.pipes[i] {
		pipes = append(pipes, p)
	}
	handed = f.handed[i]
	f.mu.Unlock()
	for _, p := range pipes {
		p.close()
	}
	return len(pipes), handed
}

// Close stops accepting, closes every relayed connection and waits for the
// relays to end.
func (f *front) Close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cancel()
	_ = f.ln.Close()
	for i := range f.targets {
		f.cut(i)
	}
	f.wg.Wait()
}
