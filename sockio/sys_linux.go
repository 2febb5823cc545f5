package sockio

import (
	"syscall"
	"unsafe"
)

// rawRead and rawWrite are read(2) and write(2) on a non-blocking socket,
// made without entering the scheduler's system-call state. p is not empty.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

// recvPeek is recvfrom(2) with MSG_PEEK|MSG_DONTWAIT into p, made like
// rawRead.
func recvPeek(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)),
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

// syscallRead and syscallWrite are the same calls through the syscall
// package, used when the race detector is on: its Read and Write tell the
// detector that what one goroutine wrote to a socket happens before what
// another read from one (as the net package's own reads and writes do), so
// tests whose goroutines meet only through sockets report no false races.
func syscallRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Read(int(fd), p)
	return max(n, 0), errno(err)
}

func syscallWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	n, err := syscall.Write(int(fd), p)
	return max(n, 0), errno(err)
}

// epollWait is epoll_pwait(2) on epfd into events, without waiting,
// made like rawRead.
func epollWait(epfd uintptr, events []syscall.EpollEvent) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, epfd, uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}
