//go:build !kvroute_noraw

package sockio

// rawCalls is false in a build with the tag kvroute_noraw, which makes
// Wrap return its connection unchanged (the net package's calls, and no
// Poller relay, which needs a Conn): the build `kvroute bench overhead
// --kvroute-baseline` measures the raw calls against (docs/benchmarks.md).
const rawCalls = true
