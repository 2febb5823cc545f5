//go:build linux || darwin

package proxy

import (
	"net"
	"syscall"

	"github.com/kvroute/kvroute/sockio"
)

// peerClosed reports whether the client at the other end of c has closed
// its side: a non-blocking peek at the socket finds the end of the stream
// (or a reset) rather than data or nothing yet. It reads nothing, so a
// pipelined next request stays where it is. Connections that are not
// sockets (or wrap one without saying how to reach it) report false.
func peerClosed(c net.Conn) bool {
	rc, ok := sockio.SyscallConn(c)
	if !ok {
		return false
	}
	closed := false
	// Control, not Read: Read fails at once past the read deadline the
	// server set for the request, which a long generation outlives.
	_ = rc.Control(func(fd uintptr) {
		n, err := sockio.Peek(fd)
		closed = n == 0 && err == 0 || err == syscall.ECONNRESET
	})
	return closed
}
