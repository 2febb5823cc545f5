package router

import (
	"fmt"
	"github.com/kvroute/kvroute/index"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
)

// fakeLeader answers every Coordinate with lead and counts the calls.
type fakeLeader struct {
	lead  Lead
	calls int
}

func (f *fakeLeader) Coordinate(string, []uint32, int) Lead {
	f.calls++
	return f.lead
}

// A request placed on load goes where the leader says, when that replica
// is a candidate within the load bound; its ticket stays with the
// decision. Otherwise the router chooses alone: as the one router when it
// leads (place 0, every time), at a random place of the fill when the
// leader did not answer.
func TestColdRequestFollowsLeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lead   Lead
		over   string // a replica pushed over the load bound first
		want   string // "" : any
		ticket uint64
	}{
		{name: "leader's choice", lead: Lead{Replica: "r1", Ticket: 7}, want: "r1", ticket: 7},
		{name: "unknown replica", lead: Lead{Replica: "r9", Ticket: 8}},
		{name: "over the bound", lead: Lead{Replica: "r3", Ticket: 9}, over: "r3"},
		{name: "self", lead: Lead{Self: true}, want: "r2"},
		{name: "no answer", lead: Lead{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reps := testFleet(t, 4)
			p := testPolicy()
			p.ix.PeerWriter().SetPeers(2)
			f := &fakeLeader{lead: tc.lead}
			p.coord.set(f)
			// Pending prefill 3000, 2000, 0 and 1000 tokens: the one
			// router's place is r2.
			for i, n := range []int64{3000, 2000, 0, 1000} {
				p.ix.RouterWriter().AddPending(reps[i], n)
				if reps[i].Name() == tc.over {
					reps[i].SetPeerInFlight(50)
				}
			}
			d := p.Pick(&Request{Key: seqKey(9, 100)}, reps)
			if f.calls != 1 {
				t.Errorf("the leader was asked %d times, want 1", f.calls)
			}
			if tc.want != "" && d.Replica.Name() != tc.want {
				t.Errorf("went to %s (%s), want %s", d.Replica.Name(), d.Reason, tc.want)
			}
			if tc.over != "" && d.Replica.Name() == tc.over {
				t.Errorf("went to %s, over the load bound", tc.over)
			}
			if d.rec.ticket != tc.ticket {
				t.Errorf("ticket %d, want %d", d.rec.ticket, tc.ticket)
			}
			if d.Reason != "cold least_load" {
				t.Errorf("reason %q", d.Reason)
			}
		})
	}
}

// Only requests placed on load ask: a new branch of a shared prefix does,
// a conversation's next turn and Explain do not.
func TestWhoAsksTheLeader(t *testing.T) {
	reps := testFleet(t, 4)
	o := testOptions()
	o.BranchBalance = 1.25
	p := NewCacheAware(o, NewSessions(time.Minute))
	shared := seqKey(1, 1000) // what every conversation starts with
	conv := func(c uint32, n int) []uint32 { return append(append([]uint32(nil), shared...), seqKey(c, n)...) }
	first := p.Pick(&Request{Key: conv(2, 400)}, reps)
	second := p.Pick(&Request{Key: conv(3, 400)}, reps)
	var idle string // a replica with no conversation (no recent work)
	for _, r := range reps {
		if r != first.Replica && r != second.Replica {
			idle = r.Name()
		}
	}
	f := &fakeLeader{lead: Lead{Replica: idle, Ticket: 5}}
	p.ix.PeerWriter().SetPeers(1)
	p.coord.set(f)

	next := p.Pick(&Request{Key: conv(2, 800)}, reps)
	if f.calls != 0 || next.Replica != first.Replica {
		t.Errorf("a next turn asked the leader %d times and went to %s (first turn on %s)", f.calls, next.Replica.Name(), first.Replica.Name())
	}
	if _, _, err := New(fleetOf(reps), p).Explain(&Request{Key: conv(4, 400)}); err != nil || f.calls != 0 {
		t.Errorf("Explain: %v, %d asks", err, f.calls)
	}
	branch := p.Pick(&Request{Key: conv(4, 400)}, reps)
	if f.calls != 1 || branch.Replica.Name() != idle || branch.rec.ticket != 5 {
		t.Errorf("a new branch: %d asks, went to %s (%s) ticket %d; want 1 ask, %s, ticket 5",
			f.calls, branch.Replica.Name(), branch.Reason, branch.rec.ticket, idle)
	}
}

// fleetOf is a Fleet of reps.
type fleetOf []*backends.Replica

func (f fleetOf) Replicas() []*backends.Replica { return f }

// recordingSharer keeps the tickets of the placements it hears of, and the
// settled work by placement.
type recordingSharer struct {
	tickets []uint64
	settled map[uint64][]int64
}

func (s *recordingSharer) Placed(_ string, _, _ []uint32, _ int64, _ *backends.Replica, ticket uint64, _ time.Time) uint64 {
	s.tickets = append(s.tickets, ticket)
	return uint64(len(s.tickets))
}
func (s *recordingSharer) Prefilled(uint64)    {}
func (s *recordingSharer) Finished(uint64)     {}
func (s *recordingSharer) Failed(uint64)       {}
func (s *recordingSharer) Trimmed(uint64, int) {}
func (s *recordingSharer) Settled(id uint64, work int64) {
	if s.settled == nil {
		s.settled = map[uint64][]int64{}
	}
	s.settled[id] = append(s.settled[id], work)
}
func (s *recordingSharer) Bound(string, *backends.Replica, time.Time) {}
func (s *recordingSharer) Stored(string, *backends.Replica)           {}

// The leader's ticket reaches the Sharer with the dispatched placement, so
// that the leader releases its reservation.
func TestTicketReachesSharer(t *testing.T) {
	specs := make([]backends.Spec, 4)
	for i := range specs {
		specs[i] = backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20300+i), Engine: backends.EngineVLLM}
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ix := index.New(index.Options{KeyBlock: 16, DefaultBudget: 1 << 20})
	rt, err := NewNamed(f, CacheAwareName, Deps{Index: ix, Sessions: NewSessions(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &recordingSharer{}
	useTestOptions(t, rt)
	rt.SetSharer(s)
	ix.PeerWriter().SetPeers(1)
	rt.SetCoordinator(&fakeLeader{lead: Lead{Replica: "r1", Ticket: 42}})
	d, err := rt.Route(&Request{Key: seqKey(5, 100)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Dispatched(func() {})()
	if len(s.tickets) != 1 || s.tickets[0] != 42 || d.Replica.Name() != "r1" {
		t.Errorf("went to %s (%s), shared tickets %v; want r1 and [42]", d.Replica.Name(), d.Reason, s.tickets)
	}
}

// A reservation counts as the leader's own placement (Index entry, pending
// prefill, recent work) and Release takes all of it back; the leader's
// next choice sees the first.
func TestReserveAndRelease(t *testing.T) {
	reps := testFleet(t, 2)
	ix := index.New(index.Options{KeyBlock: 16, DefaultBudget: 1 << 20})
	rt, err := NewNamed(fleetOf(reps), CacheAwareName, Deps{Index: ix, Sessions: NewSessions(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	useTestOptions(t, rt)
	ix.PeerWriter().SetPeers(1)
	f := &fakeLeader{lead: Lead{Replica: "r0"}}
	rt.SetCoordinator(f) // never asked: the leader places as the one router
	k1, k2 := seqKey(6, 100), seqKey(7, 100)
	r1, err := rt.Reserve("", k1, 1600)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rt.Reserve("", k2, 1600)
	if err != nil {
		t.Fatal(err)
	}
	if f.calls != 0 {
		t.Errorf("Reserve asked the leader %d times", f.calls)
	}
	if r1.Replica == r2.Replica {
		t.Errorf("two reservations of 1600 tokens on an idle fleet of two both on %s", r1.Replica.Name())
	}
	now := time.Now()
	if pendingOf(ix, r1.Replica) != 1600 || workOf(ix, r1.Replica, now) < 1500 {
		t.Errorf("reserved: pending %d, work %.0f; want 1600 each", pendingOf(ix, r1.Replica), workOf(ix, r1.Replica, now))
	}
	if m := matches(ix, k1, false, time.Time{}); len(m) == 0 {
		t.Error("the reservation is not in the Index")
	}
	r1.Release()
	r1.Release() // once only
	if p, w := pendingOf(ix, r1.Replica), workOf(ix, r1.Replica, time.Now()); p != 0 || w > 1 || w < -1 {
		t.Errorf("released: pending %d, work %.1f; want 0", p, w)
	}
	for _, m := range matches(ix, k1, false, time.Time{}) {
		if m.Tokens > 0 {
			t.Errorf("released, the Index still holds %d tokens of the key", m.Tokens)
		}
	}
}
