//go:build linux || darwin

package proxy

import (
	"net"
	"syscall"
)

// peerClosed reports whether the client at the other end of c has closed
// its side: a non-blocking peek at the socket finds the end of the stream
// (or a reset) rather than data or nothing yet. It reads nothing, so a
// pipelined next request stays where it is. Connections that are not
// sockets (or wrap one without saying how to reach it) report false.
func peerClosed(c net.Conn) bool {
	for {
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		c = u.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	// Control, not Read: Read fails at once past the read deadline the
	// server set for the request, which a long generation outlives.
	_ = rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		closed = n == 0 && err == nil || err == syscall.ECONNRESET
	})
	return closed
}
