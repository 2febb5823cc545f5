// Package overhead measures what a router costs on the request path: the
// same fast upstreams are put behind nginx (round-robin), kvroute with its
// round_robin and cache_aware policies, and nothing at all (the client talks
// to one upstream directly, the baseline), and the same closed-loop load
// generator drives each in turn.
//
// # Scenarios
//
//   - small: one short user message per request, non-streaming;
//   - multiturn: one conversation per connection, each turn appending a user
//     and an assistant message, restarted once the body would pass
//     Options.MultiTurnBytes (32 KiB), non-streaming;
//   - stream: the upstream sends Options.StreamEvents server-sent events
//     Options.StreamGap apart, each carrying its emission time (unix
//     nanoseconds) in a "t" field; the client records arrival − emission of
//     every event.
//
// Each scenario runs at Options.Concurrency connections and again at
// Options.LowConcurrency (1 by default) for a clean added-latency figure.
// The added latency of a router is its percentile minus direct's at the same
// scenario and concurrency.
//
// # Processes and CPU placement
//
// The upstreams and the load generator (the driver) run in this process;
// every router runs as a child process: nginx from a generated nginx.conf
// (runner.NginxConfig: worker_processes auto, upstream keepalive,
// proxy_http_version 1.1, Connection "", proxy_buffering off) and kvroute as
// `kvroute serve --config <generated>` (Options.KvrouteCommand), with
// log.level warn so no access line is written, and no admin listener. So the
// router never shares a Go runtime, a scheduler or a garbage collector with
// the load it is measured under.
//
// With Options.CPUs "auto" on a machine with two or more CPUs, the allowed
// CPUs are split in two halves: the driver's threads are pinned to the
// first (sched_setaffinity on every thread, GOMAXPROCS set to match) and
// every router is started under `taskset -c` on the second, where nginx's
// workers and kvroute's GOMAXPROCS follow the affinity. On two cores that is
// driver on CPU 0, router on CPU 1: each router gets exactly one core, the
// same core, whatever its process model, and never competes with the load
// generator for it; the router's CPU time per request is reported beside
// its throughput so a run limited by the driver rather than the router shows
// as such. "none" leaves placement to the kernel.
package overhead
