package sockio

import (
	"net"
	"syscall"
)

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
