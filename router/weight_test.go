package router

import (
	"errors"
	"fmt"
	"github.com/kvroute/kvroute/index"
	"math"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
)

// rep describes one replica of a test fleet: its name, weight (0: unset),
// whether it is a backup, and its static model list (nil: every model).
type rep struct {
	name   string
	weight float64
	backup bool
	models []string
}

// weightedFleet builds a real fleet of replicas on 127.0.0.1 ports where
// nothing listens. It is never started: the replicas stay healthy until a
// test reports failures, and have no metrics.
func weightedFleet(t testing.TB, reps ...rep) *backends.Fleet {
	t.Helper()
	f, err := backends.NewFleet(specsOf(reps), backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func specsOf(reps []rep) []backends.Spec {
	specs := make([]backends.Spec, 0, len(reps))
	for i, r := range reps {
		specs = append(specs, backends.Spec{Name: r.name, URL: fmt.Sprintf("http://127.0.0.1:%d", 20200+i),
			Engine: backends.EngineVLLM, Weight: r.weight, Backup: r.backup, Models: r.models})
	}
	return specs
}

// eject takes r out of service the way failing requests do.
func eject(t testing.TB, r *backends.Replica) {
	t.Helper()
	for range backends.DefaultFailThreshold {
		r.ReportFailure(errors.New("test: replica down"))
	}
	if r.Healthy() {
		t.Fatalf("%s still healthy after %d failures", r.Name(), backends.DefaultFailThreshold)
	}
}

// sequence routes n requests through rt and returns the chosen names,
// joined. With hold, each request stays in flight (it is never released).
func sequence(t testing.TB, rt *Router, n int, req func(i int) *Request, hold bool) string {
	t.Helper()
	names := make([]string, 0, n)
	for i := range n {
		d, err := rt.Route(req(i), nil)
		if err != nil {
			t.Fatal(err)
		}
		if hold {
			d.Replica.Acquire()
		}
		names = append(names, d.Replica.Name())
	}
	return strings.Join(names, "")
}

func plain(int) *Request { return &Request{Model: "m1"} }

// TestWeightedRoundRobinIsSmooth checks nginx's smooth weighted round-robin,
// for the round_robin policy and for requests not routed by prompt: the
// exact order over two cycles, so each replica gets its weight's share of
// every cycle, interleaved rather than in a burst.
func TestWeightedRoundRobinIsSmooth(t *testing.T) {
	cases := []struct {
		name    string
		weights []float64
		want    string // one cycle
	}{
		{"unset weights cycle in order", []float64{0, 0, 0}, "abc"},
		{"3:1", []float64{3, 1}, "aaba"},
		{"fractional 1.5:0.5 is 3:1", []float64{1.5, 0.5}, "aaba"},
		{"nginx's 5:1:1 example", []float64{5, 1, 1}, "aabacaa"},
		{"1:2", []float64{1, 2}, "bab"},
	}
	for _, tc := range cases {
		var reps []rep
		for i, w := range tc.weights {
			reps = append(reps, rep{name: string(rune('a' + i)), weight: w})
		}
		want := strings.Repeat(tc.want, 2)
		t.Run(tc.name+"/policy", func(t *testing.T) {
			rt := New(weightedFleet(t, reps...), &RoundRobin{})
			if got := sequence(t, rt, len(want), plain, false); got != want {
				t.Errorf("order %s, want %s", got, want)
			}
		})
		t.Run(tc.name+"/passthrough", func(t *testing.T) {
			rt := New(weightedFleet(t, reps...), LeastLoad{})
			var got strings.Builder
			for range len(want) {
				d, err := rt.Next(nil)
				if err != nil {
					t.Fatal(err)
				}
				got.WriteString(d.Replica.Name())
			}
			if got.String() != want {
				t.Errorf("order %s, want %s", got.String(), want)
			}
		})
	}
}

// TestWeightedRoundRobinSkipsUnavailable checks that an ejected replica
// drops out of the cycle and the others keep their relative weights.
func TestWeightedRoundRobinSkipsUnavailable(t *testing.T) {
	f := weightedFleet(t, rep{name: "a", weight: 2}, rep{name: "b", weight: 1}, rep{name: "c", weight: 1})
	rt := New(f, &RoundRobin{})
	eject(t, f.ByName("c"))
	if got := sequence(t, rt, 6, plain, false); got != "abaaba" {
		t.Errorf("order %s with c ejected, want abaaba", got)
	}
}

// TestLeastLoadComparesLoadPerWeight holds every request in flight: after
// each full round of total-weight requests, each replica carries exactly its
// weight's share.
func TestLeastLoadComparesLoadPerWeight(t *testing.T) {
	cases := []struct {
		name    string
		weights []float64
	}{
		{"equal", []float64{1, 1}},
		{"2:1", []float64{2, 1}},
		{"3:1", []float64{3, 1}},
		{"1:1:2", []float64{1, 1, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var reps []rep
			round := 0
			for i, w := range tc.weights {
				reps = append(reps, rep{name: string(rune('a' + i)), weight: w})
				round += int(w)
			}
			f := weightedFleet(t, reps...)
			rt := New(f, LeastLoad{})
			for k := 1; k <= 4; k++ {
				sequence(t, rt, round, plain, true)
				for i, r := range f.Replicas() {
					if got, want := r.InFlight(), int64(k)*int64(tc.weights[i]); got != want {
						t.Errorf("after %d rounds %s carries %d, want %d", k, r.Name(), got, want)
					}
				}
			}
		})
	}
}

// TestCacheAwareLoadBoundScalesWithWeight puts a prefix on h, loads h and l
// with requests in flight, and checks whether the bound lets h take one
// more: a weight-2 replica may carry twice what a weight-1 one may.
func TestCacheAwareLoadBoundScalesWithWeight(t *testing.T) {
	cases := []struct {
		name         string
		wh, wl       float64
		loadH, loadL int
		over         bool // h over the bound: the request overflows to l
	}{
		// (1+ε)·(total+1)/W with ε = 0: 8/2 = 4 each.
		{"equal weights 5+2", 1, 1, 5, 2, true},
		// 8/3 per unit of weight: h may carry ceil(16/3) = 6.
		{"weight 2 takes 6 of 8", 2, 1, 5, 2, false},
		// 10/3 per unit: h may carry ceil(20/3) = 7, not 8.
		{"weight 2 stops at 7 of 10", 2, 1, 7, 2, true},
		// 9/2 per replica: h may carry ceil(4.5) = 5.
		{"equal weights 4+4", 1, 1, 4, 4, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := weightedFleet(t, rep{name: "h", weight: tc.wh}, rep{name: "l", weight: tc.wl})
			h, l := f.ByName("h"), f.ByName("l")
			// λ 0: no match pays for going past the bound (relaxBound).
			p := NewCacheAware(CacheAwareOptions{CacheAwareConfig: CacheAwareConfig{Lambda: 0, Mu: 1, Epsilon: 0, MinMatchTokens: 256}, Index: index.Options{TTL: time.Minute, BlockSize: 16, DefaultBudget: 1 << 20, MaxBytes: 64 << 20}}, nil)
			key := seqKey(5, 4000)
			d := p.Pick(&Request{Key: key}, []*backends.Replica{h})
			d.Started()
			for range tc.loadH {
				h.Acquire()
			}
			for range tc.loadL {
				l.Acquire()
			}
			_, scores := p.Explain(&Request{Key: key}, f.Replicas())
			if scores[0].OverBound != tc.over || scores[1].OverBound {
				t.Errorf("over bound h=%v l=%v, want h=%v l=false (scores %+v)", scores[0].OverBound, scores[1].OverBound, tc.over, scores)
			}
			if scores[0].Weight != tc.wh || scores[1].Weight != tc.wl {
				t.Errorf("scores report weights %v, %v; want %v, %v", scores[0].Weight, scores[1].Weight, tc.wh, tc.wl)
			}
			want, reason := "h", "cache_hit"
			if tc.over {
				want, reason = "l", "overflow"
			}
			d = p.Pick(&Request{Key: key}, f.Replicas())
			if d.Replica.Name() != want || !strings.HasPrefix(d.Reason, reason) {
				t.Errorf("picked %s (%s), want %s (%s)", d.Replica.Name(), d.Reason, want, reason)
			}
		})
	}
}

// TestCacheAwareBoundNeverBrokenWithWeights places requests sharing one
// long prefix that every replica holds, all held in flight: the prefix
// saves nothing on one replica that it would not on another (relaxBound),
// so no replica ever goes over its weighted share of the bound, and the
// weight-2 replica takes more than a weight-1 replica's bound would let it.
func TestCacheAwareBoundNeverBrokenWithWeights(t *testing.T) {
	f := weightedFleet(t, rep{name: "h", weight: 2}, rep{name: "a"}, rep{name: "b"})
	reps := f.Replicas()
	p := testPolicy() // ε = 0.25
	system := seqKey(8, 3000)
	for i := range reps {
		first := p.Pick(&Request{Key: system}, reps[i:i+1])
		first.Started()
	}
	for i := range 100 {
		total := int64(0)
		for _, r := range reps {
			total += r.InFlight()
		}
		key := append(append([]uint32{}, system...), seqKey(uint32(2000+i), 100)...)
		d := p.Pick(&Request{Key: key}, reps)
		limit := int64(math.Ceil(1.25 * float64(total+1) / 4 * d.Replica.Weight()))
		if d.Replica.InFlight()+1 > limit {
			t.Fatalf("request %d: %s carries %d, its bound is %d", i, d.Replica.Name(), d.Replica.InFlight()+1, limit)
		}
		d.Replica.Acquire()
	}
	if h := reps[0].InFlight(); h <= 42 {
		t.Errorf("weight-2 holder of the prefix took %d of 100; a weight-1 replica's bound is 42", h)
	}
}

// TestColdPlacementByWeightedLoad sends cold requests (too short to match)
// and holds them in flight: each replica ends with its weight's share.
func TestColdPlacementByWeightedLoad(t *testing.T) {
	cases := []struct {
		name    string
		weights []float64
		n       int
		want    []int64
	}{
		{"equal", []float64{1, 1}, 8, []int64{4, 4}},
		{"3:1", []float64{3, 1}, 8, []int64{6, 2}},
		{"2:1:1", []float64{2, 1, 1}, 8, []int64{4, 2, 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var reps []rep
			for i, w := range tc.weights {
				reps = append(reps, rep{name: string(rune('a' + i)), weight: w})
			}
			f := weightedFleet(t, reps...)
			rt := New(f, testPolicy())
			seq := sequence(t, rt, tc.n, func(i int) *Request { return &Request{Key: seqKey(uint32(300+i), 100)} }, true)
			for i, r := range f.Replicas() {
				if r.InFlight() != tc.want[i] {
					t.Errorf("cold requests went %s; %s carries %d, want %d", seq, r.Name(), r.InFlight(), tc.want[i])
				}
			}
		})
	}
}

// TestSessionPolicyWeightedBoundAndRing checks that a session stays on a
// weight-2 replica carrying a load that would push it off a weight-1 one,
// and that new sessions land in proportion to weight.
func TestSessionPolicyWeightedBoundAndRing(t *testing.T) {
	cases := []struct {
		name  string
		wh    float64
		stays bool
	}{
		// h carries 5, l 2: (1+ε)·8/W with ε = 0 is 4 each at equal weights,
		// 16/3 → 6 for h at weight 2.
		{"equal weights move the session", 1, false},
		{"weight 2 keeps it", 2, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := weightedFleet(t, rep{name: "h", weight: tc.wh}, rep{name: "l"})
			h := f.ByName("h")
			sessions := NewSessions(time.Minute)
			p := NewSessionPolicy(sessions, 0)
			sessions.Bind("s", h, time.Now())
			for range 5 {
				h.Acquire()
			}
			for range 2 {
				f.ByName("l").Acquire()
			}
			d := p.Pick(&Request{Session: "s"}, f.Replicas())
			if stayed := d.Replica == h; stayed != tc.stays {
				t.Errorf("session went to %s (%s), want stays=%v", d.Replica.Name(), d.Reason, tc.stays)
			}
		})
	}
	t.Run("ring points follow weight", func(t *testing.T) {
		f := weightedFleet(t, rep{name: "h", weight: 3}, rep{name: "l"})
		p := NewSessionPolicy(NewSessions(time.Minute), 0.25)
		n := map[string]int{}
		for i := range 800 {
			n[p.Pick(&Request{Session: fmt.Sprint("user-", i)}, f.Replicas()).Replica.Name()]++
		}
		if n["h"] < 500 || n["h"] > 700 {
			t.Errorf("new sessions spread %v over weights 3:1, want about 600 on h", n)
		}
	})
}

// TestBackupOnlyWhenNoPrimaryLeft runs every policy over a fleet with two
// primaries and a backup: the backup gets nothing while a primary is
// available and untried, and takes the request once every primary is
// ejected or already tried (a retry), or when no primary serves the model.
func TestBackupOnlyWhenNoPrimaryLeft(t *testing.T) {
	policies := []struct {
		name string
		make func() Policy
	}{
		{"round_robin", func() Policy { return &RoundRobin{} }},
		{"least_load", func() Policy { return LeastLoad{} }},
		{"cache_aware", func() Policy { return testPolicy() }},
		{"session", func() Policy { return NewSessionPolicy(NewSessions(time.Minute), 0.25) }},
	}
	fleet := []rep{
		{name: "p", models: []string{"m1"}},
		{name: "q", models: []string{"m1"}},
		{name: "x", backup: true, models: []string{"m1", "m2"}},
		{name: "y", backup: true, weight: 3, models: []string{"m1"}},
	}
	cases := []struct {
		name    string
		model   string
		ejected string // replicas taken out of service
		tried   string // replicas already tried for the request
		want    string // replicas that may be chosen
	}{
		{name: "primaries up", model: "m1", want: "pq"},
		{name: "one primary ejected", model: "m1", ejected: "p", want: "q"},
		{name: "one primary tried", model: "m1", tried: "q", want: "p"},
		{name: "every primary ejected", model: "m1", ejected: "pq", want: "xy"},
		{name: "every primary tried", model: "m1", tried: "pq", want: "xy"},
		{name: "one ejected, the other tried", model: "m1", ejected: "p", tried: "q", want: "xy"},
		{name: "primaries and one backup down", model: "m1", ejected: "pqy", want: "x"},
		{name: "no primary serves the model", model: "m2", want: "x"},
	}
	for _, pol := range policies {
		for _, tc := range cases {
			t.Run(pol.name+"/"+tc.name, func(t *testing.T) {
				f := weightedFleet(t, fleet...)
				for _, n := range tc.ejected {
					eject(t, f.ByName(string(n)))
				}
				var exclude []*backends.Replica
				for _, n := range tc.tried {
					exclude = append(exclude, f.ByName(string(n)))
				}
				rt := New(f, pol.make())
				seen := ""
				for i := range 24 {
					req := &Request{Model: tc.model, Session: fmt.Sprint("s", i), Key: seqKey(uint32(400+i), 100)}
					d, err := rt.Route(req, exclude)
					if err != nil {
						t.Fatal(err)
					}
					name := d.Replica.Name()
					if !strings.Contains(tc.want, name) {
						t.Fatalf("request %d went to %s, want one of %s", i, name, tc.want)
					}
					if !strings.Contains(seen, name) {
						seen += name
					}
				}
				// Scoring applies among the backups as among primaries:
				// every allowed replica takes part.
				if len(seen) != len(tc.want) {
					t.Errorf("24 requests used only %s of %s", seen, tc.want)
				}
				if tc.model == "" || tc.model == "m1" {
					d, err := rt.Next(exclude)
					if err != nil || !strings.Contains(tc.want, d.Replica.Name()) {
						t.Errorf("passthrough went to %v (%v), want one of %s", d.Replica, err, tc.want)
					}
				}
			})
		}
	}
}

// TestNoReplicaWhenPrimariesAndBackupsGone checks the error once every
// replica, backups included, is out.
func TestNoReplicaWhenPrimariesAndBackupsGone(t *testing.T) {
	f := weightedFleet(t, rep{name: "p"}, rep{name: "x", backup: true})
	rt := New(f, &RoundRobin{})
	eject(t, f.ByName("p"))
	if _, err := rt.Route(&Request{Model: "m1"}, f.Replicas()[1:]); !errors.Is(err, ErrNoReplica) {
		t.Errorf("route with p ejected and x tried: %v, want ErrNoReplica", err)
	}
}

// TestReloadedWeightAndBackupApply changes weights and the backup flag with
// Fleet.Update: the replicas (and their in-flight counts) are kept, and the
// next decisions follow the new values.
func TestReloadedWeightAndBackupApply(t *testing.T) {
	reps := []rep{{name: "a"}, {name: "b"}}
	f := weightedFleet(t, reps...)
	a := f.ByName("a")
	release := a.Acquire()
	defer release()
	rt := New(f, &RoundRobin{})
	if got := sequence(t, rt, 2, plain, false); got != "ab" {
		t.Fatalf("order %s at equal weights, want ab", got)
	}
	reps[0].weight = 3
	if _, _, err := f.Update(specsOf(reps)); err != nil {
		t.Fatal(err)
	}
	if f.ByName("a") != a || a.InFlight() != 1 || a.Weight() != 3 {
		t.Fatalf("weight change replaced a or lost its state (same=%v in flight %d weight %v)", f.ByName("a") == a, a.InFlight(), a.Weight())
	}
	if got := sequence(t, rt, 8, plain, false); got != "aabaaaba" {
		t.Errorf("order %s after weight 3 for a, want aabaaaba", got)
	}
	reps[0].backup = true
	if _, _, err := f.Update(specsOf(reps)); err != nil {
		t.Fatal(err)
	}
	if got := sequence(t, rt, 4, plain, false); got != "bbbb" {
		t.Errorf("order %s with a made a backup, want bbbb", got)
	}
}
