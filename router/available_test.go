package router

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
)

// poolFleet builds n replicas whose pools hold one connection each.
func poolFleet(t *testing.T, n int) []*backends.Replica {
	t.Helper()
	specs := make([]backends.Spec, 0, n)
	for i := range n {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20000+i), Engine: backends.EngineVLLM})
	}
	f, err := backends.NewFleet(specs, backends.Options{MaxConnsPerReplica: 1}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f.Replicas()
}

// Available: in service, and a free connection unless the attempt may
// wait for one.
func TestAvailable(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		down, full, poolWait bool
		want                 bool
	}{
		{"healthy, free", false, false, false, true},
		{"healthy, free, may wait", false, false, true, true},
		{"healthy, pool full", false, true, false, false},
		{"healthy, pool full, may wait", false, true, true, true},
		{"ejected", true, false, false, false},
		{"ejected, may wait", true, false, true, false},
		{"ejected, pool full, may wait", true, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := poolFleet(t, 1)[0]
			if tc.full {
				t.Cleanup(rep.Acquire())
			}
			if tc.down {
				for i := 0; i < 100 && rep.Healthy(); i++ {
					rep.ReportFailure(errors.New("down"))
				}
			}
			if got := Available(rep, tc.poolWait); got != tc.want {
				t.Errorf("Available(poolWait %v) = %v, want %v", tc.poolWait, got, tc.want)
			}
		})
	}
}

// The router's candidates pass over a full pool unless the request may
// wait; a pinned replica is never passed over for its full pool.
func TestRoutePassesOverFullPools(t *testing.T) {
	reps := poolFleet(t, 2)
	rt := New(fleetOf(reps), NewCacheAware(testOptions(), nil))
	rs := NewResponses(time.Minute, 16)
	rt.SetResponses(rs)
	rs.Record("resp_1", reps[0])
	t.Cleanup(reps[0].Acquire()) // r0's pool is full

	for range 20 {
		d, err := rt.Route(&Request{Key: seqKey(1, 64)}, nil)
		if err != nil || d.Replica != reps[1] {
			t.Fatalf("route: %v %v, want r1 (r0's pool is full)", d.Replica, err)
		}
		d.Undo()
		if d, err := rt.PassThrough(&Request{}, nil); err != nil || d.Replica != reps[1] {
			t.Fatalf("pass through: %v %v, want r1", d.Replica, err)
		}
	}
	if _, err := rt.Route(&Request{Key: seqKey(1, 64)}, []*backends.Replica{reps[1]}); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("r1 tried, r0 full: %v, want ErrNoReplica", err)
	}
	d, err := rt.Route(&Request{Key: seqKey(1, 64), PoolWait: true}, []*backends.Replica{reps[1]})
	if err != nil || d.Replica != reps[0] {
		t.Fatalf("may wait: %v %v, want r0", d.Replica, err)
	}
	d.Undo()
	req := &Request{ResponseID: "resp_1", Key: seqKey(1, 64)}
	if d, err := rt.Route(req, nil); err != nil || d.Replica != reps[0] || !d.Pinned {
		t.Fatalf("pinned: %v %v pinned %v, want r0 pinned", d.Replica, err, d.Pinned)
	}
	if d, err := rt.PassThrough(req, nil); err != nil || d.Replica != reps[0] || !d.Pinned {
		t.Fatalf("pinned pass through: %v %v, want r0 pinned", d.Replica, err)
	}
}

// Explain answers as the proxy would route: past a full pool while another
// replica has room, and, when every pool is full, the replica one attempt
// would wait on, not "no replica".
func TestExplainWhenPoolsAreFull(t *testing.T) {
	reps := poolFleet(t, 2)
	rt := New(fleetOf(reps), NewCacheAware(testOptions(), nil))
	t.Cleanup(reps[0].Acquire())
	if d, _, err := rt.Explain(&Request{Key: seqKey(1, 64)}); err != nil || d.Replica != reps[1] {
		t.Fatalf("r0 full: explained %v %v, want r1", d.Replica, err)
	}
	t.Cleanup(reps[1].Acquire())
	if d, _, err := rt.Explain(&Request{Key: seqKey(1, 64)}); err != nil || d.Replica == nil {
		t.Fatalf("every pool full: explained %v %v, want the replica an attempt would wait on", d.Replica, err)
	}
}
