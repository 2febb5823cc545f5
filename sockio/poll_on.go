//go:build !kvroute_nopoller

package sockio

// pollers is false in a build with the tag kvroute_nopoller, whose
// NewPoller fails as on a system without epoll (every stream is then
// relayed by its own goroutine): the build the Poller relay is measured
// against (docs/benchmarks.md).
const pollers = true
