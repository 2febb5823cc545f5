package sockio

import (
	"errors"
	"net"
	"syscall"
)

// ErrWouldBlock is the error of a Conn's ReadNow and WriteNow when the
// socket is not ready: nothing to read yet, or no room for all of p.
var ErrWouldBlock = errors.New("sockio: socket not ready")

// SyscallConn returns the raw connection of the socket under c, looking
// through wrappers that say what they wrap (a NetConn method, as Conn and
// crypto/tls have); false when c is not a socket or hides it.
func SyscallConn(c net.Conn) (syscall.RawConn, bool) {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	return rc, err == nil
}
