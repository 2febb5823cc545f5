package proxy

import (
	"testing"

	"github.com/kvroute/kvroute/router"
)

// fullPools' phases: full pools are passed over; once no candidate is
// left, one attempt may wait; after it (or a wait in vain) none does.
func TestFullPoolsPhases(t *testing.T) {
	type step struct {
		op       string // "route", "none" (no replica left), "sent", "waited"
		poolWait bool   // after route: the request may wait
		again    bool   // after none: route again
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"a free replica: no wait", []step{{op: "route"}, {op: "sent"}, {op: "route"}}},
		{"all full: one attempt waits", []step{{op: "route"}, {op: "none", again: true}, {op: "route", poolWait: true}, {op: "sent"}, {op: "route"}, {op: "none"}}},
		{"the wait ran out: free ones without waiting", []step{{op: "none", again: true}, {op: "route", poolWait: true}, {op: "sent"}, {op: "waited"}, {op: "route"}, {op: "none"}}},
		{"after a wait in vain, none waits", []step{{op: "waited"}, {op: "route"}, {op: "none"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f fullPools
			var req router.Request
			for i, s := range tc.steps {
				switch s.op {
				case "route":
					f.route(&req)
					if req.PoolWait != s.poolWait {
						t.Fatalf("step %d: PoolWait %v, want %v", i, req.PoolWait, s.poolWait)
					}
				case "none":
					if got := f.wait(); got != s.again {
						t.Fatalf("step %d: wait() = %v, want %v", i, got, s.again)
					}
				case "sent":
					f.sent()
				case "waited":
					f.waited()
				}
			}
		})
	}
}
