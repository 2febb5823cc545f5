// Package attack runs hostile clients and a hostile upstream against a
// real kvroute process and reports, per attack, whether kvroute held and a
// figure (memory growth, failed requests, time to an answer).
//
// The hostile client (client.go) speaks HTTP/1.1 over raw TCP: it declares
// bodies it never sends, never reads answers, floods the connection cap,
// sends absolute-form targets, CONNECT, header names with spaces and
// chunked trailers. The hostile upstream (upstream.go) is a vLLM look-alike
// on raw TCP whose answer to each request is chosen by the request's
// X-Attack-Mode header: stray bytes after an answer, a 101, a bare-LF head,
// 10 MB answers, endless streams.
//
// Each attack starts its own kvroute (`kvroute serve` as a child process,
// see bench/child) with a configuration naming the hostile upstreams, and
// reads the process's resident memory from /proc/<pid>/status (VmRSS,
// VmHWM) on Linux. Formula (formula.go) gives the worst-case resident
// memory from the limits, documented in docs/memory.md.
package attack
