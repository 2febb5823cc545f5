package router

import "github.com/kvroute/kvroute/backends"

// Available is the one availability predicate of the router and the proxy:
// rep is in service (not ejected) and, unless the attempt may wait for a
// connection (poolWait), its connection pool (limits.max_conns_per_replica)
// has a free connection. A full pool is load, never a fault: the replica
// stays in service and an attempt that may wait (Request.PoolWait, set by
// the proxy's fullPools) still goes there.
func Available(rep *backends.Replica, poolWait bool) bool {
	return rep.Healthy() && (poolWait || !rep.PoolFull())
}
