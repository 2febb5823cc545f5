package sockio

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
)

// Wrap returns c with cheaper Read and Write when c is a *net.TCPConn, else
// c itself.
func Wrap(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok || !rawCalls {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	w := &Conn{TCPConn: tc, rc: rc}
	w.readFn = w.readFD
	w.writeFn = w.writeFD
	w.readNowFn = w.readNowFD
	w.writeNowFn = w.writeNowFD
	return w
}

// Conn is a TCP connection whose Read and Write are non-blocking system
// calls made without entering the scheduler's system-call state. Reads are
// sequential and writes are sequential, as on any net.Conn used by one
// reader and one writer at a time; the fields of each side are its own.
type Conn struct {
	*net.TCPConn
	rc syscall.RawConn

	// Read's state, used by readFD (bound once: a closure per call would
	// be allocated).
	readFn  func(fd uintptr) bool
	rbuf    []byte
	rn      int
	rerrno  syscall.Errno
	writeFn func(fd uintptr) bool
	// The same for ReadNow and WriteNow, made through Control.
	readNowFn, writeNowFn func(fd uintptr)
	wbuf                  []byte
	wn                    int
	werrno                syscall.Errno

	// wrote is set by a Write and cleared by the next Read, which first
	// yields (see Read).
	wrote atomic.Bool
}

// NetConn returns the connection wrapped.
func (c *Conn) NetConn() net.Conn { return c.TCPConn }

// maxRW caps one system call's length. The runtime cannot stop a goroutine
// inside a raw call (a garbage collection waits for it), so each call is
// kept short: copying 256 KiB takes tens of microseconds.
const maxRW = 256 << 10

// Read reads into p: at most one read(2) that returns data, after waiting
// for the socket to be readable when it holds nothing.
//
// The first Read after a Write first lets the other runnable goroutines
// run (runtime.Gosched): on a request-and-answer connection the peer's
// answer to what was just written (a replica's response, a client's next
// request) is rarely there yet, and reading at once would fail with
// EAGAIN, park the goroutine and wake it through the netpoller. Under
// load the read then finds the bytes; with nothing else to run, Gosched
// returns at once.
func (c *Conn) Read(p []byte) (int, error) {
	if c.wrote.Load() {
		c.wrote.Store(false)
		runtime.Gosched()
	}
	return c.readOnce(p, false)
}

// ReadNow reads into p without waiting: at most one read(2). It returns
// ErrWouldBlock when the socket holds nothing yet, io.EOF at its end.
// Deadlines do not apply; a closed connection returns net.ErrClosed.
func (c *Conn) ReadNow(p []byte) (int, error) { return c.readOnce(p, true) }

// readOnce is Read, or ReadNow when now is set: the call made through
// Control, which neither waits nor looks at deadlines.
func (c *Conn) readOnce(p []byte, now bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	c.rbuf, c.rn, c.rerrno = p, 0, 0
	var err error
	if now {
		err = c.rc.Control(c.readNowFn)
	} else {
		err = c.rc.Read(c.readFn)
	}
	c.rbuf = nil
	switch {
	case err != nil:
		return 0, c.opError("read", err)
	case c.rerrno == syscall.EAGAIN:
		return 0, ErrWouldBlock
	case c.rerrno != 0:
		return 0, c.opError("read", os.NewSyscallError("read", c.rerrno))
	case c.rn == 0:
		return 0, io.EOF
	}
	return c.rn, nil
}

func (c *Conn) readFD(fd uintptr) bool {
	for {
		n, e := rawRead(fd, c.rbuf)
		switch e {
		case 0:
			c.rn = n
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.rerrno = e
			return true
		}
	}
}

// Write writes all of p, waiting for room in the socket's buffer as
// needed, until the write deadline.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.writeAll(p, false)
	if n > 0 {
		c.wrote.Store(true)
	}
	return n, err
}

// WriteNow writes as much of p as the socket takes without waiting. It
// returns ErrWouldBlock with the count written when that is less than
// len(p). Deadlines do not apply; a closed connection returns
// net.ErrClosed.
func (c *Conn) WriteNow(p []byte) (int, error) { return c.writeAll(p, true) }

// writeAll is Write, or WriteNow when now is set.
func (c *Conn) writeAll(p []byte, now bool) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.wbuf, c.wn, c.werrno = p, 0, 0
	var err error
	if now {
		err = c.rc.Control(c.writeNowFn)
	} else {
		err = c.rc.Write(c.writeFn)
	}
	n := c.wn
	c.wbuf = nil
	switch {
	case err != nil:
		return n, c.opError("write", err)
	case c.werrno == syscall.EAGAIN:
		return n, ErrWouldBlock
	case c.werrno != 0:
		return n, c.opError("write", os.NewSyscallError("write", c.werrno))
	}
	return n, nil
}

func (c *Conn) writeFD(fd uintptr) bool {
	for c.wn < len(c.wbuf) {
		b := c.wbuf[c.wn:]
		if len(b) > maxRW {
			b = b[:maxRW]
		}
		n, e := rawWrite(fd, b)
		switch {
		case e == 0 && n == 0:
			// A socket never takes nothing without an error: fail
			// rather than try forever.
			c.werrno = syscall.EIO
			return true
		case e == 0:
			c.wn += n
		case e == syscall.EINTR:
		case e == syscall.EAGAIN:
			return false
		default:
			c.werrno = e
			return true
		}
	}
	return true
}

// opError wraps err as the net package wraps the errors of its
// connections' reads and writes.
func (c *Conn) opError(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		// The raw connection's own errors say raw-read or raw-write.
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// readNowFD is readFD without waiting: EAGAIN is its result.
func (c *Conn) readNowFD(fd uintptr) {
	if !c.readFD(fd) {
		c.rerrno = syscall.EAGAIN
	}
}

func (c *Conn) writeNowFD(fd uintptr) {
	if !c.writeFD(fd) {
		c.werrno = syscall.EAGAIN
	}
}
