//go:build linux || darwin

package backends

import "syscall"

// peekSocket looks, without reading or waiting, at what the socket behind
// rc holds: nothing yet, bytes, or its end (or an error such as a reset).
// A nil rc (a connection that is not a socket) reports peekNothing.
func peekSocket(rc syscall.RawConn) int {
	if rc == nil {
		return peekNothing
	}
	res := peekNothing
	// Control, not Read: Read waits for the socket to become readable.
	err := rc.Control(func(fd uintptr) {
		var b [1]byte
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			case err != nil || n == 0:
				res = peekClosed
			default:
				res = peekData
			}
			return
		}
	})
	if err != nil {
		return peekClosed
	}
	return res
}
