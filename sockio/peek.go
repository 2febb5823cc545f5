//go:build unix

package sockio

import "syscall"

// Peek looks at what the socket fd holds without reading it or waiting:
// it returns 1 and no error when bytes wait, 0 and no error at the end of
// the stream, EAGAIN when nothing waits yet, or the socket's error (such
// as ECONNRESET).
func Peek(fd uintptr) (int, syscall.Errno) {
	var b [1]byte
	for {
		n, e := recvPeek(fd, b[:])
		switch e {
		case 0:
			return n, 0
		case syscall.EINTR:
		default:
			return 0, e
		}
	}
}
