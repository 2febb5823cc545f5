package proxy

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// A tenant whose last request ended counts as active for shareLinger:
// the others stay over their shares, guarded, until it is forgotten.
func TestShareLinger(t *testing.T) {
	f := newFlowState(&FlowOptions{})
	join := func(tenant string) *flowRequest {
		fr := &flowRequest{tenant: tenant}
		f.shareJoin(fr)
		f.shareHold(fr)
		return fr
	}
	for range 4 {
		join("flood")
	}
	v := join("victim")
	// max_running 2 on 2 replicas, two tenants: a share of 2 each.
	if got := f.standOf("flood", 2, 2); got != shareOverGuard {
		t.Fatalf("flood with the victim in flight: stand %d, want shareOverGuard", got)
	}
	if got := f.standOf("victim", 2, 2); got != shareUnder {
		t.Fatalf("victim: stand %d, want shareUnder", got)
	}
	f.shareLeave(v)
	if got := f.standOf("flood", 2, 2); got != shareOverGuard {
		t.Fatalf("flood just after the victim's request ended: stand %d, want shareOverGuard", got)
	}
	f.mu.Lock()
	f.sweepLocked(time.Now().Add(shareLinger))
	f.mu.Unlock()
	if got := f.standOf("flood", 2, 2); got != shareAlone {
		t.Fatalf("flood once the victim is forgotten: stand %d, want shareAlone", got)
	}
	if len(f.tenants) != 1 {
		t.Fatalf("%d tenants kept, want 1", len(f.tenants))
	}
}

// standOf, which keeps its look for an under-share tenant between changes
// of the counts, answers as a naive count over every step of random
// joins, lets-go and ends of five tenants' requests.
func TestStandOfMatchesNaive(t *testing.T) {
	f := newFlowState(&FlowOptions{})
	rng := rand.New(rand.NewPCG(1, 2))
	var live []*flowRequest
	naive := func(tenant string, maxRunning, replicas int) shareStand {
		n, tl := len(f.tenants), f.tenants[tenant]
		switch {
		case n < 2 || tl == nil:
			return shareAlone
		case tl.held*n < maxRunning*replicas:
			return shareUnder
		}
		for _, o := range f.tenants {
			if o.held*n < maxRunning*replicas {
				return shareOverGuard
			}
		}
		return shareOver
	}
	for step := range 5000 {
		switch op := rng.IntN(3); {
		case op == 0 || len(live) == 0:
			fr := &flowRequest{tenant: fmt.Sprint("t", rng.IntN(5))}
			f.shareJoin(fr)
			live = append(live, fr)
		case op == 1:
			f.shareHold(live[rng.IntN(len(live))])
		default:
			i := rng.IntN(len(live))
			f.shareLeave(live[i])
			live = slices.Delete(live, i, i+1)
		}
		for _, mr := range []int{1, 4} {
			for k := range 6 {
				tenant := fmt.Sprint("t", k)
				f.mu.Lock()
				want := naive(tenant, mr, 2)
				f.mu.Unlock()
				if got := f.standOf(tenant, mr, 2); got != want {
					t.Fatalf("step %d: standOf(%s, %d, 2) = %d, naive %d", step, tenant, mr, got, want)
				}
			}
		}
	}
}
