// Package runner runs kvroute's benchmarks: one workload from bench/load
// replayed through several routers, each in front of a fresh fleet of
// bench/sim replicas, and reported side by side.
//
// # What is compared
//
// A router under test is a [Router]: kvroute with one of its
// policies (cache_aware, session, least_load, round_robin), nginx
// (round-robin over an upstream keepalive pool, proxy_buffering off) and
// HAProxy (balance leastconn, and for workloads with sessions a consistent
// hash of the X-Session-ID header with bounded load). nginx and HAProxy run
// as child processes from configurations generated into a temporary
// directory; they are skipped when their binaries are not installed.
// With Options.KvrouteCommand (kvroute bench --kvroute-process) each
// kvroute runs as a child process too, as it is deployed, from its
// configuration written into a file, its figures read from its /metrics;
// in-process, its goroutines share the Go scheduler and garbage collector
// with the simulated fleet and the load generator.
//
// kvroute/cache_aware+precise ([NamePrecise], Options.Precise) is
// cache_aware in precise mode: its fleet publishes vLLM KV events (tagged
// encoding, with a replay socket), kvroute follows every replica's
// (backends[].kv_events) and keys each request by the tokens replica 0
// renders (precise.render_url, with a render timeout of 20 ms of real
// time unless Options.PreciseRenderTimeout says otherwise). It always runs right after the approximate cache_aware, so that
// the two are compared in one report; its [PreciseResult] gives the share
// of its decisions made on exact tokens (from X-Kvroute-Route), its renders
// and fallbacks, the render p99 and the event streams' gaps, replays and
// resets (from kvroute's metrics).
//
// kvroute/cache_aware+flow ([NameFlow]) is cache_aware with flow control
// on (Options.Flow: flow.max_waiting, flow.max_wait, flow.max_queued, and
// the tenant from the X-Tenant header the load generator sends). It runs
// when named, and by default on the noisy workload: a victim tenant's
// steady one-shots and an aggressor flooding the fleet in the middle of
// the run (Options.Noisy, its rates derived from the fleet's capacity by
// the simulator's cost model, [NoisyCapacity]). There the victim first
// runs alone through kvroute/cache_aware, as the baseline, and every
// router's requests are split by tenant ([TenantResult]): sent, answered,
// refused with 429 and 503, lost, TTFT, and the victim's TTFT p90 during
// the flood over its p90 alone ([NoisyRun]).
//
// Every router gets its own fleet, started just before it and closed just
// after, so every run starts with empty prefix caches and nothing one router
// did can help or hurt the next.
//
// # What is measured
//
// Per router: the load generator's [load.Summary] (success, TTFT and
// latency percentiles, throughput and goodput at a TTFT target), the
// prefix-cache hit rate counted by the replicas themselves (the sum of their
// hit tokens over the sum of their queried tokens, as vLLM's
// prefix_cache_hits/queries counters would give), and how evenly the work
// was spread: each replica's share of requests and of prefill tokens
// (tokens actually computed, so cache misses), and the max/mean ratio of
// both. Every report carries the oracle of bench/oracle on the same arrival
// order and fleet: the ideal (one server, infinite cache), the ceiling, and
// the finite-cache bound (each request on the replica holding its longest
// cached prefix within 1.25× the mean prefill work, over LRU caches of the
// replicas' capacity); each router's hit tokens are given as a fraction of
// both. The bound's caches hold nothing but prefixes, while a replica's
// running requests pin blocks of its cache; so each router's run also
// gives the time-weighted share of the GPU cache its requests pinned
// (sim.Stats.PinnedBlockMS) and the bound over caches that much smaller.
// A router that names the replica of each answer (kvroute's
// X-Kvroute-Backend) also has its own placement replayed over the bound's
// caches (oracle.Replay): what its choices alone would have reused, apart
// from what the replicas' caches did with them.
//
// [RunFamily] runs every shape of the workload family (bench/load's
// generators, and the Mooncake and Azure traces when given) through the
// routers, each as [Run] runs one workload, and gathers one table of
// shape × router.
//
// # Time
//
// Options.TimeScale speeds up the simulated fleet and the workload's
// arrivals and think times by the same factor, and every reported duration
// is divided by it: the report reads as if the modelled hardware had run at
// its own pace. kvroute's own time-based settings that model the fleet
// (metrics poll interval, tree and session TTLs) are scaled too. What is not
// scaled is the real cost of the router and of the HTTP path, which is
// inflated by 1/TimeScale in the report: keep TimeScale moderate (0.05 or
// more) when router overhead matters.
//
// [RunURL] replays a workload against an endpoint that is not simulated (a
// real fleet, or another router) and so runs in real time: TimeScale does
// not apply there, and every reported duration is measured.
//
// # Output
//
// [Report.Markdown] renders the tables, [Report.WriteFiles] writes
// results.md, results.json and results.svg (a TTFT CDF per router plus bar
// panels of hit rate and TTFT p90).
package runner
