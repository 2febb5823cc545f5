package sockio

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"sync"
	"syscall"
)

// Handler is told by a Poller that its connection has bytes to read (or
// its end, or an error). Ready runs in the Poller's goroutine, one call at
// a time, and must not wait.
type Handler interface {
	Ready()
}

// Token names a connection added to a Poller, for Remove.
type Token struct {
	slot, gen int32
}

// pollBatch is how many ready connections one wait returns at most.
const pollBatch = 128

// Poller serves many connections' readiness from one goroutine, in the
// order the kernel reports them ready, without a goroutine hand-off per
// event: its own epoll instance, level-triggered, which Go's netpoller
// watches as one file. A connection added stays also in Go's netpoller;
// its owner must not read it through Read while it is added.
type Poller struct {
	epfd int
	file *os.File
	rc   syscall.RawConn

	mu    sync.Mutex
	slots []pollSlot // indexed by Token.slot
	next  int32      // len(slots)
	free  []int32

	events [pollBatch]syscall.EpollEvent
	n      int
	waitFn func(fd uintptr) bool

	// ctl's arguments, for ctlFD (bound once: a closure per call would be
	// allocated); ctlMu makes one Add or Remove at a time.
	ctlMu    sync.Mutex
	ctlOp    int
	ctlToken Token
	ctlErr   error
	ctlFn    func(fd uintptr)

	closeOnce sync.Once
	closed    chan struct{}
}

type pollSlot struct {
	h   Handler
	gen int32
}

// NewPoller returns a Poller; Run serves it.
func NewPoller() (*Poller, error) {
	if !pollers {
		return nil, errors.New("sockio: built without the Poller (kvroute_nopoller)")
	}
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	// A non-blocking descriptor becomes a file Go's netpoller watches.
	f := os.NewFile(uintptr(fd), "epoll")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	p := &Poller{epfd: fd, file: f, rc: rc, closed: make(chan struct{})}
	p.waitFn = p.waitFD
	p.ctlFn = p.ctlFD
	return p, nil
}

var (
	errPollerClosed = errors.New("sockio: poller closed")
	errNotSocket    = errors.New("sockio: not a connection of Wrap")
)

// Add asks the Poller to call h.Ready while c, a connection of Wrap, has
// bytes to read. It fails when c is not one, or c or the Poller is closed.
func (p *Poller) Add(nc net.Conn, h Handler) (Token, error) {
	c, ok := nc.(*Conn)
	if !ok {
		return Token{}, errNotSocket
	}
	p.mu.Lock()
	select {
	case <-p.closed:
		p.mu.Unlock()
		return Token{}, errPollerClosed
	default:
	}
	var slot int32
	if k := len(p.free); k > 0 {
		slot, p.free = p.free[k-1], p.free[:k-1]
	} else {
		slot = p.next
		p.next++
		p.slots = append(p.slots, pollSlot{})
	}
	s := &p.slots[slot]
	s.h = h
	s.gen++
	t := Token{slot: slot, gen: s.gen}
	p.mu.Unlock()
	if err := p.ctl(c, syscall.EPOLL_CTL_ADD, t); err != nil {
		p.release(t)
		return Token{}, err
	}
	return t, nil
}

// Remove stops calls for the connection added as t. A Ready of a batch
// taken before may still come once, from the Poller's goroutine, unless
// Remove is called from a Ready: handlers that Remove from elsewhere
// guard themselves. A closed connection left the epoll instance with its
// last descriptor.
func (p *Poller) Remove(nc net.Conn, t Token) {
	if c, ok := nc.(*Conn); ok {
		_ = p.ctl(c, syscall.EPOLL_CTL_DEL, t)
	}
	p.release(t)
}

func (p *Poller) release(t Token) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := &p.slots[t.slot]; s.gen == t.gen {
		s.h = nil
		s.gen++
		p.free = append(p.free, t.slot)
	}
}

// ctl adds or deletes c's descriptor while holding it open (Control), so
// that a descriptor number closed and reused meanwhile is never touched.
func (p *Poller) ctl(c *Conn, op int, t Token) error {
	p.ctlMu.Lock()
	defer p.ctlMu.Unlock()
	p.ctlOp, p.ctlToken, p.ctlErr = op, t, nil
	if err := c.rc.Control(p.ctlFn); err != nil {
		return err
	}
	return p.ctlErr
}

func (p *Poller) ctlFD(fd uintptr) {
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: p.ctlToken.slot, Pad: p.ctlToken.gen}
	if err := syscall.EpollCtl(p.epfd, p.ctlOp, int(fd), &ev); err != nil {
		p.ctlErr = os.NewSyscallError("epoll_ctl", err)
	}
}

// Run serves the Poller until ctx is done, then closes it.
func (p *Poller) Run(ctx context.Context) {
	stop := context.AfterFunc(ctx, p.close)
	defer stop()
	defer p.close()
	for {
		if err := p.rc.Read(p.waitFn); err != nil {
			return
		}
		p.serve()
		// Let the other goroutines run between batches: the next wait may
		// return at once for as long as streams are busy.
		runtime.Gosched()
	}
}

// Close stops the Poller; Run returns.
func (p *Poller) Close() { p.close() }

// Done is closed once the Poller stops: its handlers are not called again.
func (p *Poller) Done() <-chan struct{} { return p.closed }

func (p *Poller) close() {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		close(p.closed)
		p.mu.Unlock()
		_ = p.file.Close()
	})
}

// waitFD takes the ready connections without waiting; false (none) parks
// the goroutine until the epoll instance is readable.
func (p *Poller) waitFD(fd uintptr) bool {
	for {
		n, e := epollWait(fd, p.events[:])
		switch e {
		case 0:
			p.n = n
			return n > 0
		case syscall.EINTR:
		default:
			p.n = 0
			return false
		}
	}
}

// serve calls the handlers of the batch waitFD took, in order. A
// connection removed after the batch was taken is skipped.
func (p *Poller) serve() {
	for _, ev := range p.events[:p.n] {
		t := Token{slot: ev.Fd, gen: ev.Pad}
		p.mu.Lock()
		var h Handler
		if int(t.slot) < len(p.slots) && p.slots[t.slot].gen == t.gen {
			h = p.slots[t.slot].h
		}
		p.mu.Unlock()
		if h != nil {
			h.Ready()
		}
	}
}
