package proxy

import "github.com/kvroute/kvroute/backends"

// Fair shares of the batches (FlowOptions.MaxRunning). While max_running
// is set, flow control counts each tenant's requests queued and in
// flight; a tenant with requests in flight or queued is active. Its fair
// share is max_running × the replicas that could serve it, divided by the
// active tenants; a tenant holding fewer requests in flight than that is
// not held back by max_running (the other tests of saturation still
// apply), so that a flood of another tenant's requests, which fills every
// batch, cannot keep it waiting for a place in one. Each active tenant
// may pass max_running so by at most its share: all together by at most
// the fleet's max_running once more. A tenant at or over its share while
// others are active is also kept off a replica while a prompt sent there
// is prefilling (flow.go's saturated): its prompts then never share an
// engine step's prefill with another's, which would slow every request in
// that step, the other tenant's first token included.

// tenantLoad is what a tenant has with flow control.
type tenantLoad struct {
	queued int // waiting in the queue, or deciding whether to
	held   int // let go and not yet ended
}

// shareJoin counts fr as its tenant's, waiting to be let go.
func (f *flowState) shareJoin(fr *flowRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tenants[fr.tenant]
	if t == nil {
		t = &tenantLoad{}
		f.tenants[fr.tenant] = t
	}
	t.queued++
	fr.shared = true
}

// shareHold counts fr as let go (in flight), once.
func (f *flowState) shareHold(fr *flowRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holdLocked(fr)
}

func (f *flowState) holdLocked(fr *flowRequest) {
	if !fr.shared || fr.held {
		return
	}
	t := f.tenants[fr.tenant]
	t.queued--
	t.held++
	fr.held = true
}

// shareLeave takes fr out of its tenant's counts, when it ends or is
// refused; the tenant is forgotten once it has nothing left.
func (f *flowState) shareLeave(fr *flowRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !fr.shared {
		return
	}
	fr.shared = false
	t := f.tenants[fr.tenant]
	if fr.held {
		t.held--
	} else {
		t.queued--
	}
	if t.held == 0 && t.queued == 0 {
		delete(f.tenants, fr.tenant)
	}
}

// shareStand is where a tenant stands against its fair share.
type shareStand int

const (
	shareAlone shareStand = iota // the only active tenant, or no shares kept: max_running bounds it alone
	shareUnder                   // under its share while others are active: max_running does not hold it
	shareOver                    // at or over its share while others are active
)

// standOf says where tenant stands against its fair share of a fleet of
// replicas replicas at max_running each.
func (f *flowState) standOf(tenant string, maxRunning, replicas int) shareStand {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.tenants)
	t := f.tenants[tenant]
	switch {
	case n < 2 || t == nil:
		return shareAlone
	case t.held*n < maxRunning*replicas:
		return shareUnder
	}
	return shareOver
}

// stand is standOf for fr, counting the replicas that could serve it.
func (p *Proxy) stand(fr *flowRequest, fo *FlowOptions) shareStand {
	if fo.MaxRunning <= 0 || !fr.shared {
		return shareAlone
	}
	return p.flow.standOf(fr.tenant, fo.MaxRunning, p.candidateCount(fr))
}

// candidateCount is the number of available replicas that could serve
// fr's first leg.
func (p *Proxy) candidateCount(fr *flowRequest) int {
	n := 0
	p.router.Room(nil, fr.rreq.Model, firstLeg(fr.rreq), func(*backends.Replica) bool { n++; return false })
	return n
}
