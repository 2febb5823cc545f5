package sockio

import (
	"syscall"
	"unsafe"
)

// rawRead and rawWrite are read(2) and write(2) on a non-blocking socket,
// made without entering the scheduler's system-call state. p is not empty.
// Built with the race detector they also tell it, through the syscall
// package (race.go), that what one goroutine wrote to a socket happens
// before what another read from one: the raw calls made are the same.
func rawRead(fd uintptr, p []byte) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	raceAcquire(fd)
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}

func rawWrite(fd uintptr, p []byte) (int, syscall.Errno) {
	raceRelease(fd)
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

// epollWait is epoll_pwait(2) on epfd into events, without waiting,
// made like rawRead.
func epollWait(epfd uintptr, events []syscall.EpollEvent) (int, syscall.Errno) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, epfd, uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), 0
}
