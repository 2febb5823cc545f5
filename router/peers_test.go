package router

import "testing"

// A peer's request that just ended is heard of late: one request a peer
// reports in flight does not push an otherwise idle replica over the load
// bound (a conversation's next turn keeps its replica); two do.
func TestBoundToleratesOnePeerRequest(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	key := seqKey(3, 1000)
	home := p.Pick(&Request{Key: key}, reps)
	home.Started()
	for _, tc := range []struct {
		peer     int64
		overflow bool
	}{{0, false}, {1, false}, {2, true}} {
		home.Replica.SetPeerInFlight(tc.peer)
		d := p.Pick(&Request{Key: key}, reps)
		if got := d.Replica != home.Replica; got != tc.overflow {
			t.Errorf("%d peer requests in flight: went to %s (%s), overflow %v, want %v", tc.peer, d.Replica.Name(), d.Reason, got, tc.overflow)
		}
		d.Undo()
	}
}
