// Package chaos is kvroute's "nothing lost" benchmark: it puts kvroute (in
// process, cache_aware) in front of simulated vLLM replicas, each behind a
// fault injector, drives steady mixed streaming and non-streaming chat load
// through it, and injects faults along a scripted timeline:
//
//	normal → kill replica 0 → replica 1 hangs → replica 2 answers 500 →
//	garbage /metrics on replica 3 → all restored → normal
//
// The faults accumulate until "restore". Every request carries a unique
// X-Request-Id; the injectors record which replica saw which ID and what
// each sent back on the wire. Each request ends as one of:
//
//   - succeeded: a 200 JSON completion, or a stream ending with finish_reason
//     and data: [DONE];
//   - failed with a clear error: a status >= 400 with an OpenAI-style
//     {"error":{...}} body, or a stream ending with an SSE data: {"error":...}
//     event;
//   - lost: anything else (transport error, no answer before the deadline, a
//     stream cut without an error event, an error body that is not OpenAI
//     JSON, a 200 that does not parse).
//
// Lost must be 0. So must the violations of "no generation goes to a second
// replica after response bytes reached the client": for every ID seen by
// two replicas, no attempt may have answered (put a status line below 500
// on the wire) before the next attempt arrived; a 5xx is what kvroute
// retries by design and does not count. The injectors account for bytes at
// the connection, as they are written to the socket, so bytes buffered by
// the replica's HTTP server but never sent do not count.
//
// It also measures, per fault, the time from the fault's start until
// kvroute's fleet marks the replica unhealthy (eject) and from the fault's
// end until it is healthy again (restore), by polling the in-process fleet.
//
// Faults (Mode):
//
//   - killed: the listener is closed and every open connection reset (RST);
//     new connections are refused until the replica comes back on the same
//     port;
//   - hang: connections are accepted and requests read, but nothing is
//     answered and nothing closed; responses already streaming stall;
//   - error500: every POST is answered 500 with an OpenAI error body (GET
//     /health still passes, as when an engine fails requests but its HTTP
//     server lives);
//   - garbage_metrics: /metrics returns random bytes; all else is normal.
//     kvroute must keep the replica in service.
package chaos
