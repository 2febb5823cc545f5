package backends

import (
	"context"
	"errors"
	"net"
	"syscall"

	"github.com/valyala/fasthttp"
)

// errNotReplicaFault marks an error as the router's own doing; see
// [NotReplicaFault].
type errNotReplicaFault struct{ err error }

func (e errNotReplicaFault) Error() string { return e.err.Error() }
func (e errNotReplicaFault) Unwrap() error { return e.err }

// NotReplicaFault wraps err so that [IsReplicaFault] reports false for it:
// for failures the proxy itself caused, such as a response over its own
// size limit, a client that went away, or a connection it closed on
// purpose. It returns nil for a nil err.
func NotReplicaFault(err error) error {
	if err == nil {
		return nil
	}
	return errNotReplicaFault{err}
}

// IsReplicaFault reports whether err, met sending a request to a replica or
// reading its answer, says something about the replica: a refused or
// failed dial, a reset or closed connection, a timeout, a malformed
// response. Such errors count towards ejection ([Replica.ReportFailure]).
//
// Not the replica's faults, and so never counted:
//   - a full pool (fasthttp.ErrNoFreeConns): every connection to the
//     replica is busy, which is load, not failure;
//   - a connection closed by kvroute itself (net.ErrClosed: a stream cut by
//     a drain, a write timeout, a client that went away) or a cancelled
//     context;
//   - the router's own resource limits: out of file descriptors
//     (EMFILE, ENFILE), socket buffers or memory (ENOBUFS, ENOMEM), or
//     local ports (EADDRNOTAVAIL);
//   - errors wrapped with [NotReplicaFault].
func IsReplicaFault(err error) bool {
	if err == nil {
		return false
	}
	var local errNotReplicaFault
	switch {
	case errors.As(err, &local),
		errors.Is(err, fasthttp.ErrNoFreeConns),
		errors.Is(err, fasthttp.ErrConnPoolStrategyNotImpl),
		errors.Is(err, net.ErrClosed),
		errors.Is(err, context.Canceled),
		errors.Is(err, syscall.EMFILE),
		errors.Is(err, syscall.ENFILE),
		errors.Is(err, syscall.ENOBUFS),
		errors.Is(err, syscall.ENOMEM),
		errors.Is(err, syscall.EADDRNOTAVAIL):
		return false
	}
	return true
}
