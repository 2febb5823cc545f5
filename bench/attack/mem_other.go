//go:build !linux

package attack

import "errors"

// MemSupported reports whether ReadMem can read a process's memory here.
const MemSupported = false

// Mem is a process's resident memory in bytes: now (VmRSS) and at its peak
// since it started (VmHWM).
type Mem struct{ RSS, HWM int64 }

// ReadMem needs /proc/<pid>/status, which only Linux has.
func ReadMem(int) (Mem, error) {
	return Mem{}, errors.New("resident memory is read from /proc/<pid>/status: Linux only")
}
