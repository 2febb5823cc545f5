package router

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/index"
)

// matchOf is the longest prefix of key replica 0 holds, in tokens.
func matchOf(ix *index.Index, key []uint32) int {
	for _, m := range matches(ix, key, false, time.Time{}) {
		if m.Replica == 0 {
			return m.Tokens
		}
	}
	return 0
}

func TestFeedbackTrimsPastWhatTheEngineFound(t *testing.T) {
	const kb = 16
	join := func(parts ...[]uint32) []uint32 {
		var k []uint32
		for _, p := range parts {
			k = append(k, p...)
		}
		return k
	}
	sys := seqKey(1, 64)                     // a shared system prompt: 64 values, 1024 tokens
	a := seqKey(2, 64)                       // conversation A's history
	other := join(sys, seqKey(3, 64))        // B branches at the end of sys
	deep := join(sys, a[:10], seqKey(4, 40)) // D branches inside A's history
	for _, tt := range []struct {
		name     string
		reported int // engine's cached tokens for C
		trimmed  bool
	}{
		{"evicted past the system prompt", len(sys) * kb, true},
		{"within the tokenizers' slack", (len(sys)+len(a))*kb - 32, false},
		{"all found", (len(sys) + len(a)) * kb, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ix := index.New(index.Options{KeyBlock: kb, BlockSize: kb, TTL: time.Hour})
			pol := newCacheAware(ix, NewLive(CacheAwareConfig{Lambda: 1, Epsilon: 1, MinMatchTokens: 256}), nil, &coordSlot{})
			reps := stateFleet(t, ix, nil, []repState{{}})
			now := time.Now()
			ix.RouterWriter().Place(join(sys, a), false, reps[0], now)
			ix.RouterWriter().Place(other, false, reps[0], now)
			ix.RouterWriter().Place(deep, false, reps[0], now)
			c := join(sys, a, seqKey(5, 20))
			dec := pol.Pick(&Request{Key: c}, reps)
			if dec.Matched != (len(sys)+len(a))*kb {
				t.Fatalf("predicted %d tokens, want %d", dec.Matched, (len(sys)+len(a))*kb)
			}
			if got := dec.Feedback(0, tt.reported); got != tt.trimmed {
				t.Fatalf("Feedback(%d) trimmed %v, want %v", tt.reported, got, tt.trimmed)
			}
			wantDeep := len(deep) * kb
			if tt.trimmed {
				// Its own branch, below the evicted part, is gone; what it
				// shares with C, just prefilled again, is held.
				wantDeep = (len(sys) + 10) * kb
			}
			if got := matchOf(ix, deep); got != wantDeep {
				t.Errorf("D (branching inside the evicted part): held %d tokens, want %d", got, wantDeep)
			}
			if got := matchOf(ix, other); got != len(other)*kb {
				t.Errorf("B (branching where the engine's cache still reaches): held %d tokens, want %d", got, len(other)*kb)
			}
			if got := matchOf(ix, c); got != len(c)*kb {
				t.Errorf("C itself (just prefilled again): held %d tokens, want %d", got, len(c)*kb)
			}
			if want := map[bool]uint64{true: 1, false: 0}[tt.trimmed]; ix.Trims() != want {
				t.Errorf("trims %d, want %d", ix.Trims(), want)
			}
		})
	}
}

// The prefill work a decision counted is replaced, once, by what the engine
// reports it computed: its prompt tokens less those it found cached.
func TestFeedbackSettlesWork(t *testing.T) {
	const blocks = 100 // a prompt of 1,600 tokens, none cached
	for _, tt := range []struct {
		name           string
		prompt, cached int // the engine's usage; prompt 0: not reported
		want           float64
	}{
		{"as predicted", 1600, 0, 1600},
		{"the engine found more cached (an answer)", 1600, 600, 1000},
		{"the engine evicted and counts more tokens", 1700, 0, 1700},
		{"no prompt count", 0, 600, 1600},
		{"cached past the prompt", 1600, 2000, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reps := testFleet(t, 1)
			p := balancedPolicy()
			d := p.Pick(&Request{Key: seqKey(1, blocks), Tokens: 1600}, reps)
			d.Started()
			d.Feedback(tt.prompt, tt.cached)
			if tt.prompt > 0 {
				d.Feedback(tt.prompt+500, 0) // a second report changes nothing
			}
			if got := workOf(p.ix, reps[0], time.Now()); math.Abs(got-tt.want) > 1 {
				t.Errorf("recent work %.0f tokens, want %.0f", got, tt.want)
			}
		})
	}
}

// An attempt undone (its replica failed, or its pool was full) leaves no
// prefill work on the replica: the engine computed nothing for it. A
// report after that changes nothing either.
func TestUndoTakesBackWork(t *testing.T) {
	reps := testFleet(t, 2)
	p := balancedPolicy()
	kept := p.Pick(&Request{Key: seqKey(1, 100), Tokens: 1600}, reps[:1])
	undone := p.Pick(&Request{Key: seqKey(2, 50), Tokens: 800}, reps[:1])
	undone.Undo()
	undone.Undo()
	undone.Feedback(800, 0)
	kept.Feedback(1600, 0)
	if got := workOf(p.ix, reps[0], time.Now()); math.Abs(got-1600) > 1 {
		t.Errorf("recent work %.0f tokens, want 1600 (the kept decision's alone)", got)
	}
}

// A dispatched decision's settled work reaches the Sharer, once; a report
// without the prompt count, one that agrees with the prediction, or a
// decision never dispatched, tells it nothing.
func TestSettleReachesSharer(t *testing.T) {
	reps := testFleet(t, 2)
	ix := index.New(index.Options{KeyBlock: 16, DefaultBudget: 1 << 20})
	rt, err := NewNamed(fleetOf(reps), CacheAwareName, Deps{Index: ix}, nil)
	if err != nil {
		t.Fatal(err)
	}
	useTestOptions(t, rt)
	s := &recordingSharer{}
	rt.SetSharer(s)
	route := func(seed uint32, dispatch bool) Decision {
		t.Helper()
		d, err := rt.Route(&Request{Key: seqKey(seed, 100), Tokens: 1600}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if dispatch {
			d.Dispatched(func() {})
		}
		return d
	}
	settled := route(1, true)
	settled.Feedback(1600, 600)
	settled.Feedback(1600, 0) // a second report changes nothing
	unreported, undispatched := route(2, true), route(3, false)
	unreported.Feedback(0, 600)
	undispatched.Feedback(1600, 600)
	asPredicted := route(4, true)
	asPredicted.Feedback(1600, 0) // the engine computed the predicted 1,600: nothing to correct
	if want := map[uint64][]int64{1: {1000}}; !reflect.DeepEqual(s.settled, want) {
		t.Errorf("settled %v, want %v", s.settled, want)
	}
}

// Cold requests are placed on the engines' account of the work: a replica
// whose engine computed far more than predicted (it had evicted what the
// Index believed it held) takes none of them, where without the report it
// takes its share.
func TestWorkCapWeighsEngineReports(t *testing.T) {
	for _, reported := range []bool{false, true} {
		reps := testFleet(t, 2)
		p := balancedPolicy()
		first := p.Pick(&Request{Key: seqKey(1, 40), Tokens: 640}, reps)
		first.Started()
		if reported {
			first.Feedback(640*20, 0)
		}
		n := 0
		for i := range 10 {
			d := p.Pick(&Request{Key: seqKey(uint32(100+i), 40), Tokens: 640}, reps)
			d.Started()
			d.Feedback(640, 0)
			if d.Replica == first.Replica {
				n++
			}
		}
		if reported && n != 0 {
			t.Errorf("with the engine's report: %d of 10 cold requests on the replica that computed 20× its prediction", n)
		}
		if !reported && n < 3 {
			t.Errorf("without a report: %d of 10 cold requests on the first replica, want its share", n)
		}
	}
}

// TestFeedbackTouchesThePrompt checks that a request's prompt counts as
// used when its answer completes, not only when it was placed: its engine
// held the blocks until then, so the budget evicts what was used before
// (here Y) rather than a long request placed first and finished last (X).
func TestFeedbackTouchesThePrompt(t *testing.T) {
	const kb = 16
	for _, tt := range []struct {
		name     string
		feedback bool
		wantX    int // tokens of X still held after W
		wantY    int
	}{
		{"answer completed after Y and Z", true, 64 * kb, 33 * kb},
		{"no answer reported", false, 33 * kb, 64 * kb},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ix := index.New(index.Options{KeyBlock: kb, BlockSize: kb, TTL: time.Hour})
			ix.SetDefaultBudget(3800) // a share of 250 values (shareOf): low water 225
			p := newCacheAware(ix, NewLive(CacheAwareConfig{Lambda: 1, Epsilon: 1, MinMatchTokens: 256}), nil, &coordSlot{})
			start := time.Now().Add(-3 * time.Second)
			p.now = func() time.Time { return start }
			reps := stateFleet(t, ix, nil, []repState{{}})
			x, y, z, w := seqKey(1<<10, 64), seqKey(2<<10, 64), seqKey(3<<10, 64), seqKey(4<<10, 64)
			dec := p.Pick(&Request{Key: x}, reps)
			ix.RouterWriter().Place(y, false, reps[0], start.Add(time.Second))
			ix.RouterWriter().Place(z, false, reps[0], start.Add(2*time.Second))
			if tt.feedback {
				if dec.Feedback(len(x)*kb, 0) {
					t.Fatal("a full prefill trimmed the Index")
				}
			}
			ix.RouterWriter().Place(w, false, reps[0], time.Now()) // 256 values: 31 must go
			if got := matchOf(ix, x); got != tt.wantX {
				t.Errorf("X holds %d tokens, want %d", got, tt.wantX)
			}
			if got := matchOf(ix, y); got != tt.wantY {
				t.Errorf("Y holds %d tokens, want %d", got, tt.wantY)
			}
			if got := matchOf(ix, z); got != 64*kb {
				t.Errorf("Z holds %d tokens, want all %d", got, 64*kb)
			}
		})
	}
}
