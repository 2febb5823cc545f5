//go:build unix

package runner

import "syscall"

// openFileLimit returns this process's limit on open file descriptors (the
// soft limit, which the Go runtime raises to the hard one at start); 0 when
// it is not known.
func openFileLimit() int {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 0
	}
	return int(l.Cur)
}
