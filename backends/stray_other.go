//go:build !linux && !darwin

package backends

import "syscall"

// peekSocket reports peekNothing where no non-blocking peek is available:
// the framer alone then finds stray bytes, those read with an answer.
func peekSocket(syscall.RawConn) int { return peekNothing }
