//go:build unix && !linux

package sockio

import (
	"errors"
	"syscall"
)

// recvPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT into p.
func recvPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return max(n, 0), errno(err)
}

// errno is err's system error number (EIO for any other error).
func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
