//go:build unix && !linux

package sockio

import "syscall"

// Peek looks at what the socket fd holds without reading it or waiting:
// it returns 1 and no error when bytes wait, 0 and no error at the end of
// the stream, EAGAIN when nothing waits yet, or the socket's error (such
// as ECONNRESET).
func Peek(fd uintptr) (int, syscall.Errno) {
	var b [1]byte
	for {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch e := err.(type) {
		case nil:
			return n, 0
		case syscall.Errno:
			if e != syscall.EINTR {
				return 0, e
			}
		default:
			return n, syscall.EINVAL
		}
	}
}
