package router

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
)

// roleFleet builds a never-started fleet whose replicas have the roles
// given, named p0, p1, ... for prefill, d0, ... for decode, b0, ... for both.
func roleFleet(t *testing.T, roles ...backends.Role) *backends.Fleet {
	t.Helper()
	specs := make([]backends.Spec, 0, len(roles))
	count := map[backends.Role]int{}
	for i, role := range roles {
		name := fmt.Sprintf("%c%d", role[0], count[role])
		count[role]++
		specs = append(specs, backends.Spec{Name: name, URL: fmt.Sprintf("http://127.0.0.1:%d", 20400+i), Engine: backends.EngineVLLM, Role: role})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLegsRouteOverTheirRoles routes many requests of each leg under
// round_robin: the prefill leg reaches only prefill and both replicas, the
// decode leg only decode and both replicas, each in its own rotation
// (every replica of the leg as often); a whole request any replica.
func TestLegsRouteOverTheirRoles(t *testing.T) {
	f := roleFleet(t, backends.RolePrefill, backends.RoleDecode, backends.RolePrefill, backends.RoleBoth, backends.RoleDecode)
	rt := New(f, &RoundRobin{})
	cases := []struct {
		leg  backends.Role
		want string // the replicas reached, sorted
	}{
		{backends.RolePrefill, "b0 p0 p1"},
		{backends.RoleDecode, "b0 d0 d1"},
		{"", "b0 d0 d1 p0 p1"},
	}
	for _, tc := range cases {
		t.Run(string(tc.leg), func(t *testing.T) {
			seen := map[string]bool{}
			count := map[string]int{}
			for range 60 {
				d, err := rt.Route(&Request{Model: "m", Leg: tc.leg}, nil)
				if err != nil {
					t.Fatal(err)
				}
				seen[d.Replica.Name()] = true
				count[d.Replica.Name()]++
				if d.Reason != RoundRobinName {
					t.Fatalf("%q leg reason %q", tc.leg, d.Reason)
				}
			}
			if got := sortedKeys(seen); got != tc.want {
				t.Errorf("reached %s, want %s", got, tc.want)
			}
			for name, n := range count {
				if n != 60/len(count) {
					t.Errorf("%s reached %d times of 60, want %d", name, n, 60/len(count))
				}
			}
		})
	}
}

// TestDecodeLegPicksTheLeastLoaded holds requests in flight and reports
// KV usage: under a policy that leaves the decode side to the Router, the
// decode leg goes where in-flight plus waiting requests plus
// decodeKVWeight × KV usage is lowest, and skips tried replicas.
func TestDecodeLegPicksTheLeastLoaded(t *testing.T) {
	f := roleFleet(t, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode, backends.RoleDecode)
	rt := New(f, LeastLoad{})
	d0, d1, d2 := f.ByName("d0"), f.ByName("d1"), f.ByName("d2")
	now := time.Now()
	d0.Observe(backends.Snapshot{At: now, KVUsage: 0.9})              // 3.6
	d1.Observe(backends.Snapshot{At: now, Waiting: 1, KVUsage: 0.25}) // 2
	d2.Observe(backends.Snapshot{At: now, KVUsage: 0})                // 0, then 3 in flight
	for range 3 {
		defer d2.Acquire()()
	}
	req := &Request{Model: "m", Leg: backends.RoleDecode}
	for range 20 {
		d, err := rt.Route(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica != d1 || d.Reason != DecodeReason {
			t.Fatalf("decode leg chose %s (%s), want d1 (loads 3.6, 2, 3)", d.Replica.Name(), d.Reason)
		}
	}
	d, err := rt.Route(req, []*backends.Replica{d1})
	if err != nil || d.Replica != d2 {
		t.Fatalf("with d1 tried: %v %v, want d2", d.Replica, err)
	}
	if _, err := rt.Route(req, []*backends.Replica{d0, d1, d2}); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("every decode replica tried: err %v, want ErrNoReplica", err)
	}
}

// A decode replica computing a prompt (tokens pending there, as a
// relieved or local prefill leaves them) counts decodeComputing requests
// more: a paired request decodes elsewhere unless that is as loaded.
func TestDecodeLegAvoidsAReplicaComputingAPrompt(t *testing.T) {
	f, ix, rt := cacheAwareRoles(t, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode)
	d0, d1 := f.ByName("d0"), f.ByName("d1")
	computing := ix.RouterWriter().AddPending(d0, 100)
	defer computing.Prefilled()
	req := &Request{Model: "m", Leg: backends.RoleDecode}
	for _, tc := range []struct {
		inflight int // on d1
		want     string
	}{{0, "d1"}, {1, "d1"}, {decodeComputing, "d0 d1"}, {decodeComputing + 1, "d0"}} {
		t.Run(strconv.Itoa(tc.inflight), func(t *testing.T) {
			for range tc.inflight {
				defer d1.Acquire()()
			}
			seen := map[string]bool{}
			for range 40 { // ties are drawn at random
				d, err := rt.Route(req, nil)
				if err != nil {
					t.Fatal(err)
				}
				seen[d.Replica.Name()] = true
			}
			if got := sortedKeys(seen); got != tc.want {
				t.Errorf("with %d in flight on d1 the decode leg reached %s, want %s", tc.inflight, got, tc.want)
			}
		})
	}
}

// fewRunning counts both the requests in flight to a replica and those its
// engine reports, and without fresh metrics none qualifies.
func TestFewRunning(t *testing.T) {
	f := roleFleet(t, backends.RoleDecode)
	d0 := f.ByName("d0")
	now := time.Now()
	for _, tc := range []struct {
		name     string
		limit    int
		inflight int
		snap     *backends.Snapshot
		want     bool
	}{
		{name: "no limit", want: true},
		{name: "no metrics", limit: 2},
		{name: "stale metrics", limit: 2, snap: &backends.Snapshot{At: now.Add(-time.Hour)}},
		{name: "idle", limit: 1, snap: &backends.Snapshot{At: now}, want: true},
		{name: "engine running", limit: 1, snap: &backends.Snapshot{At: now, Running: 1}},
		{name: "engine queue", limit: 2, snap: &backends.Snapshot{At: now, Running: 1, Waiting: 1}},
		{name: "one in flight", limit: 1, inflight: 1, snap: &backends.Snapshot{At: now}},
		{name: "below both", limit: 3, inflight: 2, snap: &backends.Snapshot{At: now, Running: 2}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := d0
			if tc.snap != nil {
				rep.Observe(*tc.snap)
			} else {
				rep = roleFleet(t, backends.RoleDecode).ByName("d0") // never observed
			}
			for range tc.inflight {
				defer rep.Acquire()()
			}
			if got := fewRunning(rep, tc.limit, now); got != tc.want {
				t.Errorf("fewRunning = %t, want %t", got, tc.want)
			}
		})
	}
}

// cacheAwareRoles is a cache_aware Router (test options, an Index of
// 16-token key blocks) over a roleFleet of roles, with its fleet and Index.
func cacheAwareRoles(t *testing.T, roles ...backends.Role) (*backends.Fleet, *index.Index, *Router) {
	t.Helper()
	f := roleFleet(t, roles...)
	ix := index.New(index.Options{KeyBlock: 16, DefaultBudget: 1 << 20})
	rt, err := NewNamed(f, CacheAwareName, Deps{Index: ix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	useTestOptions(t, rt)
	return f, ix, rt
}

func sortedKeys(m map[string]bool) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return strings.Join(ks, " ")
}

// A session's requests decode where its last one did (its transferred
// prefix is cached there) while that replica is not overloaded, and the
// binding is apart from the session's prefill binding.
func TestDecodeLegKeepsTheSession(t *testing.T) {
	f := roleFleet(t, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode)
	rt, err := NewNamed(f, LeastLoadName, Deps{Sessions: NewSessions(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Model: "m", Session: "conv-1", Leg: backends.RoleDecode}
	first, err := rt.Route(req, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := f.ByName("d0")
	if first.Replica == other {
		other = f.ByName("d1")
	}
	// The session's replica carries one more request than the other.
	defer first.Replica.Acquire()()
	d, _ := rt.Route(req, nil)
	if d.Replica != first.Replica || d.Reason != SessionName {
		t.Fatalf("second request went to %s (%s), want the session's %s", d.Replica.Name(), d.Reason, first.Replica.Name())
	}
	if rep := rt.Sessions().Lookup("conv-1", time.Now()); rep != nil {
		t.Errorf("the decode binding took the session's own key (bound to %s)", rep.Name())
	}
	// Three more in flight: 4 against 0, past the other's plus one.
	for range 3 {
		defer first.Replica.Acquire()()
	}
	d, _ = rt.Route(req, nil)
	if d.Replica != other {
		t.Fatalf("an overloaded session replica kept the session: %s", d.Replica.Name())
	}
	d.Undo()
	if rep := rt.Sessions().Lookup(decodeSessionPrefix+"conv-1", time.Now()); rep != first.Replica {
		t.Errorf("Undo left the session on %v", rep)
	}
}

// A replica that decoded a prompt with its KV pulled from a prefill
// replica holds the prompt: when it also prefills (role both) the next
// request of the prefix is prefilled there; a decode-only replica is
// never recorded.
func TestReceivedPricesTheDecodeReplica(t *testing.T) {
	f, ix, rt := cacheAwareRoles(t, backends.RolePrefill, backends.RoleBoth, backends.RoleDecode)
	b0, d0 := f.ByName("b0"), f.ByName("d0")
	req := &Request{Model: "m", Key: seqKey(7, 64), Tokens: 64 * 16, Leg: backends.RolePrefill}
	rt.Received(req, d0)
	if st := ix.Stats(); st.Held[d0.ID()] != 0 || st.Tokens != 0 {
		t.Fatalf("a decode-only replica was recorded: %+v", st)
	}
	rt.Received(req, b0)
	for range 4 {
		d, err := rt.Route(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Replica != b0 || d.Matched == 0 {
			t.Fatalf("prefill leg chose %s (%s, matched %d), want b0, which received the prompt's KV", d.Replica.Name(), d.Reason, d.Matched)
		}
		d.Undo()
	}
}

// A decode replica that holds all of a prompt but at most
// Request.LocalPrefill tokens of it (its last turn's KV, received) gets
// the next turn whole (Decision.Local), unless it is loaded past the
// least loaded candidate's plus one, was tried, or the option is off.
func TestDecodeLegPrefillsLocally(t *testing.T) {
	f, ix, rt := cacheAwareRoles(t, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode, backends.RoleDecode)
	d0, d1 := f.ByName("d0"), f.ByName("d1")
	// Off: a decode replica's receipt is not recorded.
	rt.Received(&Request{Model: "m", Key: seqKey(7, 64), Tokens: 64 * 16, Leg: backends.RoleDecode}, d1)
	if st := ix.Stats(); st.Held[d1.ID()] != 0 {
		t.Fatalf("a decode-only replica was recorded without LocalPrefill: %+v", st)
	}
	// The first turn: 64 blocks of 16 tokens, received by d1.
	rt.Received(&Request{Model: "m", Key: seqKey(7, 64), Tokens: 64 * 16, Leg: backends.RoleDecode, LocalPrefill: LocalPrefill{Tokens: 512}}, d1)
	next := func(local int, key []uint32) *Request {
		return &Request{Model: "m", Key: key, Tokens: len(key) * 16, Leg: backends.RoleDecode, LocalPrefill: LocalPrefill{Tokens: local}}
	}
	cases := []struct {
		name     string
		req      *Request
		inflight int // requests held in flight on d1
		tried    []*backends.Replica
		local    bool
	}{
		{name: "next turn", req: next(512, seqKey(7, 66)), local: true},
		{name: "the same prompt", req: next(512, seqKey(7, 64)), local: true},
		{name: "one more in flight", req: next(512, seqKey(7, 66)), inflight: 1, local: true},
		{name: "two more in flight", req: next(512, seqKey(7, 66)), inflight: 2},
		{name: "more left than allowed", req: next(16, seqKey(7, 66))},
		{name: "off", req: next(0, seqKey(7, 66))},
		{name: "another prompt", req: next(512, seqKey(8, 2))},
		{name: "no key", req: next(512, nil)},
		{name: "holder tried", req: next(512, seqKey(7, 66)), tried: []*backends.Replica{d1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for range tc.inflight {
				defer d1.Acquire()()
			}
			for range 10 { // ties among the others are drawn at random
				d, err := rt.Route(tc.req, tc.tried)
				if err != nil {
					t.Fatal(err)
				}
				if d.Local != tc.local || tc.local && d.Replica != d1 {
					t.Fatalf("chose %s (%s, local %t), want local %t on d1", d.Replica.Name(), d.Reason, d.Local, tc.local)
				}
				if tc.local && (d.Matched != 1024 || d.Best != 1024 || d.Reason != LocalReason+" matched=1024") {
					t.Fatalf("local decision %+v, want matched and best 1024", d)
				}
				if !tc.local && d.Reason != DecodeReason {
					t.Fatalf("reason %q, want %q", d.Reason, DecodeReason)
				}
				d.Undo() // the decision recorded the prompt on its replica
			}
		})
	}
	// A replica that computed a prompt itself holds it too.
	rt.Received(next(512, seqKey(9, 8)), d0)
	if d, _ := rt.Route(next(512, seqKey(9, 9)), nil); d.Replica != d0 || !d.Local {
		t.Fatalf("the next turn of d0's prompt went to %s (%s)", d.Replica.Name(), d.Reason)
	}
	// Of two holding as much, the less loaded; equally loaded, either.
	rt.Received(next(512, seqKey(7, 64)), d0)
	seen := map[string]bool{}
	for range 40 {
		d, _ := rt.Route(next(512, seqKey(7, 66)), nil)
		seen[d.Replica.Name()] = d.Local
		d.Undo()
	}
	if !seen["d0"] || !seen["d1"] || len(seen) != 2 {
		t.Errorf("two equal holders, equally loaded: chose %v, want both, locally", seen)
	}
	release := d1.Acquire()
	defer release()
	for range 10 {
		d, _ := rt.Route(next(512, seqKey(7, 66)), nil)
		if d.Replica != d0 || !d.Local {
			t.Fatalf("with d1 one request busier: chose %s (%s), want d0", d.Replica.Name(), d.Reason)
		}
		d.Undo()
	}
}

// A local decision is recorded as a policy's pick is: Undo takes back what
// it added, and an engine's report of fewer cached tokens than predicted
// trims the decode replica's entries past that point (what else shared
// the prompt was evicted too), so that their next turns are paired.
func TestLocalDecisionIsRecorded(t *testing.T) {
	f, ix, rt := cacheAwareRoles(t, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode)
	d0 := f.ByName("d0")
	req := func(key []uint32) *Request {
		return &Request{Model: "m", Key: key, Tokens: len(key) * 16, Leg: backends.RoleDecode, LocalPrefill: LocalPrefill{Tokens: 64}}
	}
	// d0 holds a conversation that branches from seqKey(7, ...) after 4 values.
	other := append(seqKey(7, 4), 900, 901, 902, 903)
	rt.Received(req(other), d0)
	held := func() int64 { return ix.Stats().Held[d0.ID()] }
	before := held()
	d, _ := rt.Route(req(seqKey(7, 6)), nil)
	if !d.Local || d.Replica != d0 || held() <= before {
		t.Fatalf("local decision %s (%s): held %d after, %d before; want d0, recorded", d.Replica.Name(), d.Reason, held(), before)
	}
	d.Undo()
	if held() != before {
		t.Fatalf("Undo left d0 holding %d tokens, want %d", held(), before)
	}
	if d, _ = rt.Route(req(append(other, 904)), nil); !d.Local {
		t.Fatalf("the other conversation's next turn: %s, want local", d.Reason)
	}
	d.Undo()
	d, _ = rt.Route(req(seqKey(7, 6)), nil)
	if !d.Local || !d.Feedback(6*16, 0) {
		t.Fatalf("the engine found nothing cached of a local decision (%s): Index not trimmed", d.Reason)
	}
	if d, _ = rt.Route(req(append(other, 904)), nil); d.Local {
		t.Fatalf("after the trim the other conversation's next turn still went local: %s", d.Reason)
	}
}

// While every prefill replica has LocalPrefill.Backlog tokens pending, a
// decode replica computing no prompt of its own takes a prompt whose
// prefill it would finish sooner than the prefill side (Decision.Local,
// BacklogReason); its prompt is pending there until it answers.
func TestDecodeLegRelievesABackloggedPrefillSide(t *testing.T) {
	f, ix, rt := cacheAwareRoles(t, backends.RolePrefill, backends.RolePrefill, backends.RoleDecode, backends.RoleDecode)
	p0, p1, d0, d1 := f.ByName("p0"), f.ByName("p1"), f.ByName("d0"), f.ByName("d1")
	w := ix.RouterWriter()
	now := time.Now()
	// p0 holds 4,000 of a 5,008-token prompt, d1 3,008 of it (in blocks of 16).
	long := seqKey(5, 5008/16)
	w.Place(long[:4000/16], false, p0, now)
	w.Place(long[:3008/16], false, d1, now)
	// Their engines run 1 and 3 requests (LocalPrefill.MaxRunning).
	d0.Observe(backends.Snapshot{At: now, Running: 1})
	d1.Observe(backends.Snapshot{At: now, Running: 3})
	req := func(key []uint32, backlog int) *Request {
		return &Request{Model: "m", Key: key, Tokens: len(key) * 16, Leg: backends.RoleDecode, LocalPrefill: LocalPrefill{Backlog: backlog}}
	}
	cases := []struct {
		name         string
		pending      [4]int64 // p0, p1, d0, d1
		inflight     [2]int   // requests held in flight on d0 and d1
		maxRunning   int
		req          *Request
		want         []*backends.Replica // the replicas a relief may choose; none: no relief
		matched      int
		best         int   // the most a prefill replica holds, if more
		pendingAfter int64 // on the chosen replica, once chosen
	}{
		{name: "behind", pending: [4]int64{2000, 2000, 0, 0}, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d0, d1}, pendingAfter: 64},
		{name: "one prefill replica not behind", pending: [4]int64{2000, 500, 0, 0}, req: req(seqKey(9, 4), 1000)},
		{name: "off", pending: [4]int64{2000, 2000, 0, 0}, req: req(seqKey(9, 4), 0)},
		{name: "one decode replica computing", pending: [4]int64{2000, 2000, 100, 0}, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d1}, pendingAfter: 64},
		{name: "both computing", pending: [4]int64{2000, 2000, 100, 100}, req: req(seqKey(9, 4), 1000)},
		{name: "d0 loaded", pending: [4]int64{2000, 2000, 0, 0}, inflight: [2]int{2, 0}, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d1}, pendingAfter: 64},
		// p0: 2,000 + 1,008 left; d1: 2,000 left, d0: 5,008.
		{name: "the fewest left", pending: [4]int64{2000, 2000, 0, 0}, req: req(long, 1000), want: []*backends.Replica{d1}, matched: 3008, best: 4000, pendingAfter: 2000},
		// p0: 5,000 + 1,008 left; d1, one request in flight, 2,000; d0,
		// none, 5,008: the fewer decodes stalled first.
		{name: "the least loaded before the fewest left", pending: [4]int64{5000, 5000, 0, 0}, inflight: [2]int{0, 1}, req: req(long, 1000), want: []*backends.Replica{d0}, best: 4000, pendingAfter: 5008},
		// p0: 1,000 + 1,008 left, about d1's 2,000.
		{name: "as soon on the prefill side", pending: [4]int64{992, 3000, 0, 0}, req: req(long, 900)},
		{name: "both running few enough", pending: [4]int64{2000, 2000, 0, 0}, maxRunning: 4, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d0, d1}, pendingAfter: 64},
		{name: "d1 running too many", pending: [4]int64{2000, 2000, 0, 0}, maxRunning: 3, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d0}, pendingAfter: 64},
		{name: "d1 running many more", pending: [4]int64{2000, 2000, 0, 0}, maxRunning: 2, req: req(seqKey(9, 4), 1000), want: []*backends.Replica{d0}, pendingAfter: 64},
		{name: "both running too many", pending: [4]int64{2000, 2000, 0, 0}, maxRunning: 1, req: req(seqKey(9, 4), 1000)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for i, rep := range []*backends.Replica{p0, p1, d0, d1} {
				pp := w.AddPending(rep, tc.pending[i])
				defer pp.Prefilled()
			}
			for i, d := range []*backends.Replica{d0, d1} {
				for range tc.inflight[i] {
					defer d.Acquire()()
				}
			}
			tc.req.LocalPrefill.MaxRunning = tc.maxRunning
			seen := map[*backends.Replica]bool{}
			for range 20 { // ties are drawn at random
				d, err := rt.Route(tc.req, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(tc.want) == 0 {
					if d.Local || d.Reason != DecodeReason {
						t.Fatalf("chose %s (%s), want no relief", d.Replica.Name(), d.Reason)
					}
					continue
				}
				seen[d.Replica] = true
				if !d.Local || !slices.Contains(tc.want, d.Replica) || d.Reason != BacklogReason+" matched="+strconv.Itoa(tc.matched) {
					d.Undo()
					t.Fatalf("chose %s (%s, local %t), want a relief on one of %v", d.Replica.Name(), d.Reason, d.Local, tc.want)
				}
				if d.Matched != tc.matched || d.Best != max(tc.best, tc.matched) {
					d.Undo()
					t.Fatalf("matched %d, best %d; want %d and %d", d.Matched, d.Best, tc.matched, max(tc.best, tc.matched))
				}
				v := ix.View(time.Now())
				if got := v.OwnPending(d.Replica); got != tc.pendingAfter+tc.pending[slices.Index([]*backends.Replica{p0, p1, d0, d1}, d.Replica)] {
					t.Fatalf("%s pending %d after the choice", d.Replica.Name(), got)
				}
				d.Undo()
			}
			if len(tc.want) > 0 && len(seen) != len(tc.want) {
				t.Errorf("chose %d replicas of %d over 20 routes", len(seen), len(tc.want))
			}
		})
	}
	// Every prefill replica down: any decode replica relieves.
	for _, p := range []*backends.Replica{p0, p1} {
		for p.Healthy() {
			p.ReportFailure(errors.New("down"))
		}
	}
	if d, _ := rt.Route(req(seqKey(9, 4), 1000), nil); !d.Local {
		t.Fatalf("no prefill replica up: %s, want a relief", d.Reason)
	}
}
