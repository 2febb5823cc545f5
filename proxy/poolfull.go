package proxy

import (
	"slices"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/router"
)

// fullPools steers one request around replicas whose connection pool
// (limits.max_conns_per_replica) is full. A full pool is load, never the
// replica's failure: the request first goes to a replica with a free
// connection; when every candidate is full, one attempt waits for a
// connection, up to limits.conn_wait (backends.Options.MaxConnWaitTimeout),
// on the replica the policy prefers among them; when that wait runs out,
// replicas whose pool has freed meanwhile are still tried, without waiting,
// and then the request gets 503 with Retry-After. None of this spends a
// retry (Options.Retries) or counts towards ejection.
type fullPools struct {
	skipped []*backends.Replica // passed over for a full pool; in tried until the wait
	phase   int                 // poolsSkip, poolsWait or poolsWaited
}

const (
	poolsSkip   = iota // full pools are passed over
	poolsWait          // the next attempt may wait for a connection
	poolsWaited        // a wait was allowed once: full pools are passed over
)

// skip reports whether to pass over the replica of dec for its full pool.
// It then undoes dec and adds its replica to tried. A pinned replica (the
// only one holding the request's stored response) is never passed over.
func (f *fullPools) skip(dec *router.Decision, tried *[]*backends.Replica) bool {
	switch {
	case f.phase == poolsWait:
		f.phase = poolsWaited // this attempt may wait; no other will
		return false
	case dec.Pinned || !dec.Replica.PoolFull():
		return false
	}
	dec.Undo()
	*tried = append(*tried, dec.Replica)
	if f.phase == poolsSkip {
		f.skipped = append(f.skipped, dec.Replica)
	}
	return true
}

// wait is called when routing found no replica left to try. When some were
// passed over for a full pool and no attempt has waited yet, it takes them
// out of tried, so that the next route picks among them and its attempt
// waits for a connection, and reports true.
func (f *fullPools) wait(tried *[]*backends.Replica) bool {
	if f.phase != poolsSkip || len(f.skipped) == 0 {
		return false
	}
	*tried = slices.DeleteFunc(*tried, func(r *backends.Replica) bool { return slices.Contains(f.skipped, r) })
	f.skipped = nil
	f.phase = poolsWait
	return true
}

// waited records an attempt that waited for a connection in vain (its
// replica's pool stayed full for limits.conn_wait): no later attempt waits.
func (f *fullPools) waited() { f.phase = poolsWaited }
