package proxy

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
)

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
// that step, the other tenant's first token included. And while a tenant
// under its share is active, a tenant over its share may not take the last
// replica with no prompt prefilling (keepsClean): the under-share
// tenant's next prompt then finds one where it is the only prefill in the
// engine's next step, rather than waiting behind another's.

// tenantLoad is what a tenant has with flow control.
type tenantLoad struct {
	queued int       // waiting in the queue, or deciding whether to
	held   int       // let go and not yet ended
	idle   time.Time // when both last fell to 0 (see shareLinger)
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
	f.gen++
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
	f.gen++
}

// shareLeave takes fr out of its tenant's counts, when it ends or is
// refused; the tenant is forgotten shareLinger after it has nothing left.
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
		t.idle = time.Now()
	}
	f.gen++
	f.sweepLocked(time.Now())
}

// shareLinger is how long a tenant with nothing queued or in flight still
// counts as active: a tenant sending one request after another at a
// steady pace has none in flight between some of them, and would
// otherwise hand every batch to a flood in each such gap, to find its next
// prompt behind the flood's.
const shareLinger = time.Second

// sweep is sweepLocked now, for the dispatcher's tick: tenants idle
// since the last request ended are forgotten without waiting for another.
func (f *flowState) sweep() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sweepLocked(time.Now())
}

// sweepLocked forgets the tenants idle for shareLinger, at most once a
// shareLinger (now), so that the work is proportional to the tenants
// seen in the last one. Under mu.
func (f *flowState) sweepLocked(now time.Time) {
	if now.Sub(f.swept) < shareLinger {
		return
	}
	f.swept = now
	for k, t := range f.tenants {
		if t.held == 0 && t.queued == 0 && now.Sub(t.idle) >= shareLinger {
			delete(f.tenants, k)
			f.gen++
		}
	}
}

// shareStand is where a tenant stands against its fair share.
type shareStand int

const (
	shareAlone     shareStand = iota // the only active tenant, or no shares kept: max_running bounds it alone
	shareUnder                       // under its share while others are active: max_running does not hold it
	shareOver                        // at or over its share while others are active
	shareOverGuard                   // shareOver while some active tenant is under its share
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
	if f.someUnderLocked(n, maxRunning*replicas) {
		return shareOverGuard
	}
	return shareOver
}

// underMemo is the last answer of someUnderLocked, valid while the
// tenants' counts are those of generation gen.
type underMemo struct {
	gen   uint64
	share int
	under bool
}

// someUnderLocked reports whether a tenant holds fewer than share/n
// requests, n being the tenants counted. The dispatcher asks for every
// request it looks at, the counts changing only when one is let go or
// ends, so the answer is kept per generation of the counts. Under mu.
func (f *flowState) someUnderLocked(n, share int) bool {
	if m := f.under; m.gen == f.gen && m.share == share {
		return m.under
	}
	under := false
	for _, o := range f.tenants {
		if o.held*n < share {
			under = true
			break
		}
	}
	f.under = underMemo{gen: f.gen, share: share, under: under}
	return under
}

// stand is standOf for fr, counting the replicas that could serve it.
func (p *Proxy) stand(fr *flowRequest, fo *FlowOptions) shareStand {
	if fo.MaxRunning <= 0 || !fr.shared {
		return shareAlone
	}
	return p.flow.standOf(fr.tenant, fo.MaxRunning, p.candidateCount(fr))
}

// keepsClean reports whether fr, of a tenant over its share while another
// tenant is under its (shareOverGuard), must wait so as not to take the
// last of two or more replicas that could serve it with no prompt
// prefilling (view) and none let go to it this round (extra).
func (p *Proxy) keepsClean(fr *flowRequest, view *index.View, extra map[*backends.Replica]int) bool {
	n, clean := 0, 0
	p.router.Room(nil, fr.rreq.Model, firstLeg(fr.rreq), func(rep *backends.Replica) bool {
		n++
		if view.Pending(rep) == 0 && extra[rep] == 0 {
			clean++
		}
		return false
	})
	return n >= 2 && clean <= 1
}

// idleFirst returns the replicas to keep fr, of a tenant under its share,
// off: those full, and those where another prompt is prefilling (view) or
// one was let go to this round (extra), whose step fr would wait for,
// while a replica with room has neither. It returns false, and fr goes by
// the policy among those not full, when none has room and nothing
// prefilling, or when a busy one holds at least localityMinTokens more of
// fr's prompt than the others: prefilling that prefix again costs more
// than waiting for one step.
func (p *Proxy) idleFirst(fr *flowRequest, full func(*backends.Replica) bool, view *index.View,
	extra map[*backends.Replica]int) ([]*backends.Replica, bool) {
	busy := func(rep *backends.Replica) bool { return view.Pending(rep) > 0 || extra[rep] > 0 }
	avoid, _, ok := p.router.Room(nil, fr.rreq.Model, firstLeg(fr.rreq), func(rep *backends.Replica) bool {
		return full(rep) || busy(rep)
	})
	if !ok || len(avoid) == 0 {
		return avoid, ok
	}
	held := p.router.Held(fr.rreq, nil)
	var busyMost, idleMost int32
	for id, n := range held {
		switch i := slices.IndexFunc(avoid, func(r *backends.Replica) bool { return r.ID() == id }); {
		case i < 0:
			idleMost = max(idleMost, n)
		case !full(avoid[i]):
			busyMost = max(busyMost, n)
		}
	}
	return avoid, busyMost < idleMost+localityMinTokens
}

// candidateCount is the number of available replicas that could serve
// fr's first leg.
func (p *Proxy) candidateCount(fr *flowRequest) int {
	n := 0
	p.router.Room(nil, fr.rreq.Model, firstLeg(fr.rreq), func(*backends.Replica) bool { n++; return false })
	return n
}
