//go:build !linux && !darwin

package backends

import "syscall"

// peeker reports peekNothing where no non-blocking peek is available: the
// framer alone then finds stray bytes, those read with an answer.
type peeker struct{}

func newPeeker(syscall.RawConn) *peeker { return nil }

func (*peeker) peek() int { return peekNothing }
