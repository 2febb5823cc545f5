package proxy

import (
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
