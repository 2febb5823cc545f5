package proxy

import "github.com/kvroute/kvroute/router"

// fullPools steers one request around replicas whose connection pool
// (limits.max_conns_per_replica) is full, by saying of each attempt
// whether it may wait for a connection (router.Request.PoolWait, which
// router.Available reads). A full pool is load, never the replica's
// failure: first the router passes over the replicas whose pool is full;
// when no candidate is left, one attempt may wait for a connection, up to
// limits.conn_wait (backends.Options.MaxConnWaitTimeout), on the replica
// the policy prefers among them all; when that wait runs out, replicas
// whose pool has freed meanwhile are still tried, without waiting, and
// then the request gets 503 with Retry-After. None of this spends a retry
// (Options.Retries) or counts towards ejection. A pinned replica (the only
// one holding the request's stored response) is never passed over for a
// full pool (router.Router's pinned path allows the wait).
type fullPools struct {
	phase int // poolsSkip, poolsWait or poolsWaited
}

const (
	poolsSkip   = iota // full pools are passed over
	poolsWait          // the next attempt may wait for a connection
	poolsWaited        // a wait was allowed once: full pools are passed over
)

// route sets req.PoolWait for the next attempt: true only in poolsWait.
func (f *fullPools) route(req *router.Request) { req.PoolWait = f.phase == poolsWait }

// sent records that an attempt went out: a wait allowed is spent.
func (f *fullPools) sent() {
	if f.phase == poolsWait {
		f.phase = poolsWaited
	}
}

// wait is called when routing found no replica left to try. When no
// attempt has been allowed to wait yet, the next one may (a replica left
// only because its pool was full is a candidate again), and it reports
// true; routing then finds none only when no replica had a full pool.
func (f *fullPools) wait() bool {
	if f.phase != poolsSkip {
		return false
	}
	f.phase = poolsWait
	return true
}

// waited records an attempt that waited for a connection in vain (its
// replica's pool stayed full for limits.conn_wait): no later attempt waits.
func (f *fullPools) waited() { f.phase = poolsWaited }
