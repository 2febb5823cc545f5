//go:build linux || darwin

package backends

import (
	"syscall"

	"github.com/kvroute/kvroute/sockio"
)

// peeker looks at what a socket holds without reading it.
type peeker struct {
	rc  syscall.RawConn
	fn  func(fd uintptr) // p.peekFD, bound once: a closure per peek would be allocated
	res int
}

func newPeeker(rc syscall.RawConn) *peeker {
	p := &peeker{rc: rc}
	p.fn = p.peekFD
	return p
}

// peek looks, without reading or waiting, at what the socket holds:
// nothing yet, bytes, or its end (or an error such as a reset). A nil p
// (a connection that is not a socket) reports peekNothing.
func (p *peeker) peek() int {
	if p == nil {
		return peekNothing
	}
	// Control, not Read: Read waits for the socket to become readable.
	if err := p.rc.Control(p.fn); err != nil {
		return peekClosed
	}
	return p.res
}

func (p *peeker) peekFD(fd uintptr) {
	n, err := sockio.Peek(fd)
	switch {
	case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
		p.res = peekNothing
	case err != 0 || n == 0:
		p.res = peekClosed
	default:
		p.res = peekData
	}
}
