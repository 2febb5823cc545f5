package router

import (
	"fmt"
	"github.com/kvroute/kvroute/index"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
)

// testFleet builds n replicas. They are never started: no check runs, so
// they stay healthy and have no metrics (the router's own counts stand in).
func testFleet(t testing.TB, n int) []*backends.Replica { return newTestFleet(t, n).Replicas() }

// newTestFleet builds a fleet of n replicas named r0, r1, …, never started.
func newTestFleet(t testing.TB, n int) *backends.Fleet {
	t.Helper()
	specs := make([]backends.Spec, 0, n)
	for i := range n {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 20000+i), Engine: backends.EngineVLLM})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testOptions() CacheAwareOptions {
	return CacheAwareOptions{CacheAwareConfig: CacheAwareConfig{Lambda: 2048, Mu: 4096, Epsilon: 0.25, MinMatchTokens: 256}, Index: index.Options{TTL: time.Minute, BlockSize: 16, DefaultBudget: 1 << 20, MaxBytes: 64 << 20}}
}

// useTestOptions puts testOptions in force in rt: its cache_aware
// configuration, and its Index's TTL and block size.
func useTestOptions(t *testing.T, rt *Router) {
	t.Helper()
	o := testOptions()
	mustSet(t, rt.Configs(), CacheAwareName, &o.CacheAwareConfig)
	rt.Index().SetTTL(o.Index.TTL)
	rt.Index().SetBlockSize(o.Index.BlockSize)
}

// mustSet puts cfg in force for the policy named name.
func mustSet(t *testing.T, cs *Configs, name string, cfg any) {
	t.Helper()
	if err := cs.Set(name, cfg); err != nil {
		t.Fatal(err)
	}
}

func testPolicy() *CacheAware { return NewCacheAware(testOptions(), NewSessions(time.Minute)) }

func seqKey(prefix uint32, n int) []uint32 {
	k := make([]uint32, n)
	for i := range k {
		k[i] = prefix<<20 | uint32(i)
	}
	return k
}

func TestCacheAwareFollowsPrefixAndCountsWholeBlocks(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	key := seqKey(1, 1000)
	first := p.Pick(&Request{Key: key}, reps)
	if first.Reason != "cold least_load" {
		t.Fatalf("first pick %q, want cold", first.Reason)
	}
	longer := append(append([]uint32{}, key...), seqKey(2, 500)...)
	d := p.Pick(&Request{Key: longer}, reps)
	if d.Replica != first.Replica || d.Matched != 992 || d.Reason != "cache_hit matched=992" {
		t.Errorf("second pick %s %q matched %d; want %s, 992 (whole 16-token blocks of 1000)", d.Replica.Name(), d.Reason, d.Matched, first.Replica.Name())
	}
}

func TestColdRequestsSpread(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	count := map[string]int{}
	var releases []func()
	for i := 0; i < 40; i++ {
		d := p.Pick(&Request{Key: seqKey(uint32(100+i), 300)[:100]}, reps)
		count[d.Replica.Name()]++
		releases = append(releases, d.Replica.Acquire())
	}
	for _, r := range releases {
		r()
	}
	for _, r := range reps {
		if count[r.Name()] != 10 {
			t.Errorf("cold requests spread %v, want 10 each", count)
			break
		}
	}
}

func TestSharedPrefixAloneNeverPullsAllTraffic(t *testing.T) {
	reps := testFleet(t, 4)
	p := testPolicy()
	system := seqKey(7, 2000)
	count := map[string]int{}
	var releases []func()
	for i := 0; i < 100; i++ {
		key := append(append([]uint32{}, system...), seqKey(uint32(1000+i), 200)...)
		d := p.Pick(&Request{Key: key}, reps)
		count[d.Replica.Name()]++
		releases = append(releases, d.Replica.Acquire())
	}
	for _, r := range releases {
		r()
	}
	for _, r := range reps {
		if c := count[r.Name()]; c > 32 {
			t.Errorf("%s took %d of 100 requests sharing one prefix: %v", r.Name(), c, count)
		}
	}
}

func TestTTLStopsCounting(t *testing.T) {
	reps := testFleet(t, 2)
	p := testPolicy()
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	key := seqKey(3, 800)
	p.Pick(&Request{Key: key}, reps)
	if _, scores := p.Explain(&Request{Key: key}, reps); maxMatched(scores) != 800 {
		t.Fatalf("fresh entry matched %d", maxMatched(scores))
	}
	now = now.Add(2 * time.Minute)
	if _, scores := p.Explain(&Request{Key: key}, reps); maxMatched(scores) != 0 {
		t.Errorf("entry older than TTL still matched %d", maxMatched(scores))
	}
}

func maxMatched(s []Score) int {
	m := 0
	for _, x := range s {
		m = max(m, x.Matched)
	}
	return m
}

func TestUndoRemovesFailedChoice(t *testing.T) {
	reps := testFleet(t, 2)
	p := testPolicy()
	key := seqKey(4, 640)
	d := p.Pick(&Request{Key: key}, reps)
	d.Undo()
	if _, scores := p.Explain(&Request{Key: key}, reps); maxMatched(scores) != 0 {
		t.Errorf("undone choice still matches %d tokens", maxMatched(scores))
	}
}

func TestTreeStaysUnderBoundWhenFlooded(t *testing.T) {
	reps := testFleet(t, 4)
	const bound = 2 << 20
	p := NewCacheAware(CacheAwareOptions{CacheAwareConfig: CacheAwareConfig{Lambda: 2048, Mu: 4096, Epsilon: 0.25, MinMatchTokens: 256}, Index: index.Options{TTL: time.Minute, BlockSize: 16, DefaultBudget: 1 << 30, MaxBytes: bound}}, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	key := make([]uint32, 2000)
	for i := 0; i < 3000; i++ {
		for j := range key {
			key[j] = rng.Uint32() % 100000
		}
		p.Pick(&Request{Key: key}, reps)
		if b := p.Index().Stats().Bytes; b > bound {
			t.Fatalf("after %d unique prompts the tree holds %d bytes > bound %d", i+1, b, bound)
		}
	}
}

func TestSessionPolicySticksAndBounds(t *testing.T) {
	reps := testFleet(t, 4)
	p := NewSessionPolicy(NewSessions(time.Minute), 0.25)
	home := p.Pick(&Request{Session: "s1"}, reps).Replica
	for i := 0; i < 5; i++ {
		if d := p.Pick(&Request{Session: "s1"}, reps); d.Replica != home || d.Reason != "session" {
			t.Fatalf("session moved to %s (%s)", d.Replica.Name(), d.Reason)
		}
	}
	// Overload home: the session moves and then stays on its new replica.
	var rel []func()
	for i := 0; i < 5; i++ {
		rel = append(rel, home.Acquire())
	}
	moved := p.Pick(&Request{Session: "s1"}, reps).Replica
	if moved == home {
		t.Fatal("session stayed on an overloaded replica")
	}
	for _, r := range rel {
		r()
	}
	if d := p.Pick(&Request{Session: "s1"}, reps); d.Replica != moved {
		t.Errorf("session did not stay on %s after moving", moved.Name())
	}
	// Many sessions spread over all replicas.
	count := map[string]int{}
	for i := 0; i < 400; i++ {
		count[p.Pick(&Request{Session: fmt.Sprint("u", i)}, reps).Replica.Name()]++
	}
	for _, r := range reps {
		if count[r.Name()] < 50 {
			t.Errorf("consistent hashing spread %v", count)
			break
		}
	}
}

// BenchmarkDecision measures match + score + record for prompts of 8k and
// 32k tokens, with keys as the router makes them (block=16: one value per
// 16-token block) and, for comparison, one value per token (block=1).
func BenchmarkDecision(b *testing.B) {
	for _, block := range []int{16, 1} {
		for _, tokens := range []int{8 << 10, 32 << 10} {
			for _, n := range []int{8, 64, 1000} {
				b.Run(fmt.Sprintf("block=%d/tokens=%d/replicas=%d", block, tokens, n), func(b *testing.B) {
					benchDecision(b, block, tokens, n)
				})
			}
		}
	}
}

func benchDecision(b *testing.B, block, tokens, n int) {
	reps := testFleet(b, n)
	opts := testOptions()
	opts.Index.KeyBlock = block
	p := NewCacheAware(opts, NewSessions(time.Minute))
	rng := rand.New(rand.NewPCG(3, 4))
	// Pre-fill: conversations sharing a system prompt, each held by one
	// replica, spread over the fleet.
	system := seqKey(9, 2048/block)
	keys := make([][]uint32, 256)
	now := time.Now()
	for i := range keys {
		k := append(append([]uint32{}, system...), seqKey(uint32(rng.IntN(1<<11)), (tokens-2048)/block)...)
		keys[i] = k
		p.Index().RouterWriter().Place(k, false, reps[i%n], now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	lat := make([]time.Duration, 0, b.N)
	for i := 0; i < b.N; i++ {
		start := time.Now()
		p.Pick(&Request{Key: keys[i%len(keys)], Tokens: tokens}, reps)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	reportP99(b, lat)
}

func reportP99(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	b.ReportMetric(float64(sorted[len(sorted)*99/100].Microseconds()), "p99-µs")
}

// TestConfiguredCacheTokensBoundReplicaShare checks that a replica's
// configured cache_tokens (GPU plus offload tiers) sizes its share of the
// tree: a replica given 20k tokens holds about that much, while one without a
// configured capacity keeps the (larger) default budget.
func TestConfiguredCacheTokensBoundReplicaShare(t *testing.T) {
	specs := []backends.Spec{
		{Name: "small", URL: "http://127.0.0.1:20100", Engine: backends.EngineVLLM, CacheTokens: 20_000},
		{Name: "default", URL: "http://127.0.0.1:20101", Engine: backends.EngineVLLM},
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	reps := f.Replicas()
	if got := reps[0].CacheTokens(); got != 20_000 {
		t.Fatalf("CacheTokens() = %d, want the configured 20000", got)
	}
	if got := reps[1].CacheTokens(); got != 0 {
		t.Fatalf("CacheTokens() = %d without configuration or metrics, want 0", got)
	}
	p := testPolicy() // default budget 1<<20 tokens
	for i := range 40 {
		for _, r := range reps {
			p.Pick(&Request{Key: seqKey(uint32(i+1), 2000)}, []*backends.Replica{r})
		}
	}
	held := p.Index().Stats().Held
	// Its share swings between its budget and 90 % of it, around 20000.
	// The Index sizes a share to hold its capacity on average: 20/19 of it.
	if h, budget := held[reps[0].ID()], int64(20_000)*20/19; h > budget || h < budget*9/10 {
		t.Errorf("replica with cache_tokens 20000 holds %d tokens, want %d–%d", h, budget*9/10, budget)
	}
	if h := held[reps[1].ID()]; h != 80_000 {
		t.Errorf("replica with the default budget holds %d tokens, want all 80000", h)
	}
}

// TestIsCold: a request is cold with no match, or with a best match
// shorter than both MinMatchTokens and half its prompt.
func TestIsCold(t *testing.T) {
	cfg := &CacheAwareConfig{MinMatchTokens: 256}
	for _, tc := range []struct {
		best, prompt int
		cold         bool
	}{
		{0, 0, true},
		{0, 1000, true},
		{128, 1000, true},   // a short prefix of a long prompt
		{128, 256, false},   // half a short prompt
		{128, 200, false},   // most of a short prompt
		{112, 230, true},    // under half
		{256, 10000, false}, // MinMatchTokens
		{300, 10000, false},
	} {
		if got := isCold(tc.best, tc.prompt, cfg); got != tc.cold {
			t.Errorf("best %d of a %d-token prompt: cold %v, want %v", tc.best, tc.prompt, got, tc.cold)
		}
	}
}
