package router

import (
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/index"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
)

// explainFixture is a Router of a registered policy over a fleet it shares
// with a twin, each with a session table and an Index of its own, both
// primed alike.
type explainFixture struct {
	r        *Router
	reps     []*backends.Replica
	placedAt time.Time // when the primed Index entry was last used
}

// explainKey is the prompt the fixture's Index holds on r0.
var explainKey = seqKey(7, 64)

// explainRequests are requests explained and then routed, each in the
// way of one piece of state: a session bound long ago (an expired
// binding), new sessions (the session table is full: a binding evicts
// one), bound ones, an ID past the bound (counted as rejected when
// routed), none, a prompt held on r0 and cold ones.
func explainRequests() []Request {
	return []Request{
		{Model: "m1", Session: "expired", Key: seqKey(8, 64)},
		{Model: "m1", Session: "new-1", Key: explainKey},
		{Model: "m1", Session: "bound", Key: seqKey(9, 64)},
		{Model: "m1", Session: strings.Repeat("x", 64), Key: seqKey(10, 64)},
		{Model: "m1", Key: seqKey(11, 64)},
		{Model: "m1", Session: "new-2"},
	}
}

// newExplainFixture builds the fixture's Router of policy over fleet and
// primes it: r0 holds explainKey, used placedAt; "expired" was bound to
// r1 two TTLs ago, "bound" and two other sessions to r2, r0 and r1 now,
// filling the table (4 bindings).
func newExplainFixture(t *testing.T, policy string, f *backends.Fleet) *explainFixture {
	t.Helper()
	const ttl = time.Minute
	ca := testOptions().CacheAwareConfig
	ca.MinMatchTokens = 32
	deps := Deps{
		Index:    index.New(index.Options{DefaultBudget: 1 << 20, MaxBytes: 16 << 20, TTL: time.Minute, BlockSize: 16}),
		Sessions: NewSessions(ttl),
		Configs:  &Configs{},
	}
	mustSet(t, deps.Configs, CacheAwareName, &ca)
	mustSet(t, deps.Configs, SessionName, &SessionConfig{Epsilon: 0.5})
	deps.Sessions.SetLimits(4, 32)
	r, err := NewNamed(f, policy, deps, nil)
	if err != nil {
		t.Fatal(err)
	}
	reps := f.Replicas()
	now := time.Now()
	fx := &explainFixture{r: r, reps: reps, placedAt: now.Add(-ttl / 2)}
	deps.Index.RouterWriter().Place(explainKey, false, reps[0], fx.placedAt)
	deps.Sessions.Bind("bound", reps[2], now)
	deps.Sessions.Bind("other-a", reps[0], now)
	deps.Sessions.Bind("other-b", reps[1], now)
	deps.Sessions.Bind("expired", reps[1], now.Add(-2*ttl)) // last: a later Bind would drop it
	return fx
}

// routerState is what can be observed of a Router's state without
// deciding anything.
type routerState struct {
	Sessions  SessionStats
	Bound     map[string]string
	Index     index.Stats
	Writes    map[string]uint64
	Trims     uint64
	Pending   []int64
	Work      []float64
	FreshHeld []radix.Match // entries of explainKey used after placedAt
}

func (fx *explainFixture) state(at time.Time) routerState {
	st := routerState{Sessions: fx.r.Sessions().Stats(), Bound: map[string]string{}}
	for _, id := range []string{"expired", "new-1", "new-2", "bound", "other-a", "other-b"} {
		st.Bound[id] = repName(fx.r.Sessions().Lookup(id, at))
	}
	ix := fx.r.Index()
	st.Index, st.Writes, st.Trims = ix.Stats(), ix.WritesBySource(), ix.Trims()
	for _, rep := range fx.reps {
		st.Pending = append(st.Pending, pendingOf(ix, rep))
		st.Work = append(st.Work, workOf(ix, rep, at))
	}
	st.FreshHeld = matches(ix, explainKey, false, fx.placedAt.Add(time.Millisecond))
	return st
}

// Explaining changes nothing, for every registered policy: after 100
// explains each request's answer is the one it had first, the Router's
// state (sessions, the Index, its entries' recency, pending prefill and
// work) is as it was, the first request then routes where its explain
// said, and every request after routes as on a twin Router that was
// never asked to explain (which a rotation moved on, or a session table
// whose order changed, would not).
func TestExplainChangesNothing(t *testing.T) {
	for _, e := range Policies() {
		t.Run(e.Name, func(t *testing.T) {
			f := newTestFleet(t, 3)
			reps := f.Replicas()
			// Loads 2, 1, 0: no tie is broken at random.
			for _, rep := range []*backends.Replica{reps[0], reps[0], reps[1]} {
				t.Cleanup(rep.Acquire())
			}
			fx, twin := newExplainFixture(t, e.Name, f), newExplainFixture(t, e.Name, f)
			reqs := explainRequests()
			before := fx.state(time.Now())
			first := make([]Decision, len(reqs))
			for i := range 100 {
				j := i % len(reqs)
				dec, _, err := fx.r.Explain(&reqs[j])
				if err != nil {
					t.Fatalf("explain %d: %v", i, err)
				}
				if i < len(reqs) {
					first[j] = dec
				} else if dec.Replica != first[j].Replica || dec.Reason != first[j].Reason {
					t.Fatalf("explain %d of request %d: %s %q, first %s %q", i, j, dec.Replica.Name(), dec.Reason, first[j].Replica.Name(), first[j].Reason)
				}
			}
			if after := fx.state(time.Now()); !reflect.DeepEqual(after, before) {
				t.Errorf("state changed by 100 explains:\nbefore %+v\nafter  %+v", before, after)
			}
			for j := range reqs {
				got, err := fx.r.Route(&reqs[j], nil)
				if err != nil {
					t.Fatal(err)
				}
				want, err := twin.r.Route(&reqs[j], nil)
				if err != nil {
					t.Fatal(err)
				}
				if j == 0 && (got.Replica != first[0].Replica || got.Reason != first[0].Reason) {
					t.Errorf("request 0 routed to %s %q, explained as %s %q", got.Replica.Name(), got.Reason, first[0].Replica.Name(), first[0].Reason)
				}
				if got.Replica != want.Replica || got.Reason != want.Reason {
					t.Errorf("request %d routed to %s %q, on the twin never explained to %s %q", j, got.Replica.Name(), got.Reason, want.Replica.Name(), want.Reason)
				}
			}
			now := time.Now()
			if got, want := fx.state(now), twin.state(now); !reflect.DeepEqual(got.Sessions, want.Sessions) || !reflect.DeepEqual(got.Bound, want.Bound) {
				t.Errorf("sessions after routing %+v %v, on the twin %+v %v", got.Sessions, got.Bound, want.Sessions, want.Bound)
			}
		})
	}
}

// A policy that cannot tell its choice without making it is not asked:
// Explain refuses it rather than pick and undo.
func TestExplainRefusesAPolicyThatOnlyPicks(t *testing.T) {
	f := newTestFleet(t, 2)
	p := &pickOnly{}
	r := New(f, p)
	if _, _, err := r.Explain(&Request{}); !errors.Is(err, ErrNoExplain) {
		t.Errorf("Explain: %v, want ErrNoExplain", err)
	}
	if p.picks != 0 {
		t.Errorf("Explain picked %d times", p.picks)
	}
}

// pickOnly is a policy with Pick alone.
type pickOnly struct{ picks int }

func (*pickOnly) Name() string { return "pick_only" }

func (p *pickOnly) Pick(_ *Request, cands []*backends.Replica) Decision {
	p.picks++
	return Decision{Replica: cands[0], Reason: fmt.Sprint("pick ", p.picks)}
}
