// Package sockio makes the reads and writes of TCP connections cheaper for
// a process that relays many small messages, such as the server-sent events
// of thousands of streams.
//
// A read or write on a [net.TCPConn] enters the Go scheduler's system-call
// state around the system call. A socket of the net package is
// non-blocking, so the call never waits, but while it runs the scheduler's
// monitor may hand the goroutine's processor to another thread, and the
// thread returning from the call must then get one back: on a router
// confined to one CPU that is a context switch or two per event. [Wrap]
// returns a connection whose Read and Write make the same non-blocking
// calls without entering that state, and wait for readiness through the
// connection's own poller (syscall.RawConn), so deadlines, Close from
// another goroutine and every other method behave as on the connection
// wrapped.
//
// Built with the race detector, the calls go through the syscall package's
// Read and Write instead, which tell the detector that a socket's write
// happens before the read of what it wrote: the code paths are the same,
// and tests see no false races.
package sockio
