// Package backends keeps the fleet of inference replicas (vLLM or SGLang
// servers speaking the OpenAI API) that kvroute forwards to: one pooled
// fasthttp.HostClient per replica, the router's in-flight accounting, health
// (active checks plus passive failure reports), the served model list and the
// engine's load signals polled from /metrics.
//
// The package knows nothing of the proxy or the router; they read from it.
//
// # State and concurrency
//
// A [Replica] separates configuration ([Spec]) from runtime state (health,
// counters, the last metrics [Snapshot], the last fetched model list). Every
// reader method is lock-free and safe for concurrent use; snapshots and model
// lists are immutable once published and must not be modified by callers.
// [Fleet.Update] swaps the replica list copy-on-write: a replica whose Name and
// URL are unchanged keeps its state, so a configuration reload does not reset
// what is known about it.
//
// # Health
//
// Replicas start healthy (optimistic): the router may use a replica before its
// first check completes, and a replica that is down fails fast on dial, which
// the router retries elsewhere. Consecutive failed requests
// ([Replica.ReportFailure]: passive) or consecutive failed checks (GET
// /health not 2xx, or unreachable: active), each counted apart, eject the
// replica once either reaches [Options.FailThreshold]. A served request
// ([Replica.ReportSuccess]) ends the requests' streak and a passing check
// the checks', so a health endpoint that answers does not hide requests
// that fail. Only a passing active check returns an ejected replica to
// service, its streaks started over. Metrics never affect health: a replica
// whose /metrics is missing, slow or malformed stays in service, its
// snapshot simply goes stale. Metrics are polled whatever the health, so a
// replica returning to service has a fresh snapshot at once. A replica that
// passes /health but fails requests alternates between ejection (passive) and
// return (next active check, within HealthInterval).
//
// # Background loops
//
// [Fleet.Start] runs, per replica, one health loop (GET /health, then
// GET /v1/models when the spec lists no models) and one metrics loop
// (GET /metrics). Each loop runs once immediately, then on a ticker, stops
// when the Start context is cancelled or the replica is removed by
// [Fleet.Update], and recovers and logs a panic in any round. Start returns
// once every replica's first health round is over (bounded by the health
// timeout), so the model list is known before requests are served.
//
// # Addresses and TLS
//
// A replica's URL may carry a base path, prefixed to every request sent to
// it; [Replica.SetRequestURI] points a proxied request at the replica.
// https replicas get one TLS client configuration each ([Spec.TLS] over
// [Options.TLSConfig]), shared by proxied traffic and checks, which dial
// the same way: connect and TLS handshake within [Options.ConnectTimeout].
// Proxied connections also carry the first-byte and stream-idle read
// deadlines ([Options.FirstByteTimeout], [Fleet.SetTimeouts]) and refuse
// response heads fasthttp would mishandle ([ErrBadResponseHead]).
//
// Checks use a small HostClient of their own per replica (separate from
// [Replica.Client]) so a pool saturated by long streaming generations can
// neither delay a health check nor make it fail with ErrNoFreeConns.
package backends
