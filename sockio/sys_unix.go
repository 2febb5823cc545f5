//go:build unix && !linux

package sockio

import "syscall"

// recvPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT into p.
func recvPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return max(n, 0), errno(err)
}
