//go:build race

package sockio

import "syscall"

// The race detector learns that a socket's write happens before the reads
// after it from the syscall package's Read and Write, which every other
// socket of the process (the net package's) goes through: each Write
// releases one synchronization object of that package and each Read that
// succeeds acquires it. The raw calls tell it the same by making, next
// to each, such a call of length 0, which moves no byte: a write of
// nothing before the raw write, a read of nothing after the raw read.

func raceRelease(fd uintptr) { _, _ = syscall.Write(int(fd), nil) }

func raceAcquire(fd uintptr) { _, _ = syscall.Read(int(fd), nil) }
