//go:build linux && race

package sockio

import "syscall"

// sysRead and sysWrite are read(2) and write(2) through the syscall
// package when the race detector is on: its Read and Write tell the
// detector that what one goroutine wrote to a socket happens before what
// another read from one (as the net package's own reads and writes do), so
// tests whose goroutines meet only through sockets report no false races.
// p is not empty.
func sysRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return n, errno(err)
}

func sysWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return n, errno(err)
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.EIO
}
