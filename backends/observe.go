package backends

// Observe publishes s as the replica's latest metrics snapshot, as a
// metrics round does: s.At is when it was taken (it goes stale
// Options.StaleAfter later) and s.InFlightAtScrape the router's in-flight
// count then. It lets what is known of a replica from elsewhere than its
// own /metrics (a test's chosen state, a peer's report) reach the policies.
func (r *Replica) Observe(s Snapshot) { r.snap.Store(&s) }
