package flow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// nginxModel is nginx's limit_req lookup, naively: per key an excess in
// milli-requests and the time of the last request in milliseconds.
type nginxModel struct {
	rate, burst int64 // milli-requests per second, milli-requests
	nodelay     bool
	nodes       map[string]*nginxNode
}

type nginxNode struct{ excess, last int64 }

func newNginxModel(rate float64, burst int, nodelay bool) *nginxModel {
	return &nginxModel{rate: int64(rate * 1000), burst: int64(burst) * 1000, nodelay: nodelay, nodes: map[string]*nginxNode{}}
}

// request is one request of key at now (ms): whether it passes and its
// delay in ms. With commit false the state is left as it was.
func (m *nginxModel) request(key string, now int64, commit bool) (ok bool, delay int64) {
	n := m.nodes[key]
	if n == nil {
		if commit {
			m.nodes[key] = &nginxNode{excess: 0, last: now}
		}
		return true, 0
	}
	ms := now - n.last
	if ms < -60000 {
		ms = 1
	} else if ms < 0 {
		ms = 0
	}
	excess := n.excess - m.rate*ms/1000 + 1000
	if excess < 0 {
		excess = 0
	}
	if excess > m.burst {
		return false, 0
	}
	if commit {
		n.excess = excess
		if ms != 0 {
			n.last = now
		}
	}
	if m.nodelay {
		return true, 0
	}
	return true, excess * 1000 / m.rate
}

func TestRateMatchesNginx(t *testing.T) {
	for _, rate := range []float64{1, 5, 100} {
		for _, burst := range []int{0, 1, 5} {
			for _, nodelay := range []bool{false, true} {
				name := fmt.Sprintf("rate=%v/burst=%d/nodelay=%v", rate, burst, nodelay)
				t.Run(name, func(t *testing.T) {
					checkAgainstNginx(t, rate, burst, nodelay)
				})
			}
		}
	}
}

func checkAgainstNginx(t *testing.T, rate float64, burst int, nodelay bool) {
	rng := rand.New(rand.NewPCG(uint64(rate*1000)+uint64(burst), map[bool]uint64{false: 1, true: 2}[nodelay]))
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: rate, Burst: burst, NoDelay: nodelay}, clk)
	model := newNginxModel(rate, burst, nodelay)
	period := time.Duration(float64(time.Second) / rate)
	var elapsed time.Duration // since the Limiter's epoch
	nowMs := func(d time.Duration) int64 { return int64(d / time.Millisecond) }
	keys := []string{"a", "b", "c"}
	var accepted, refused int
	for step := 0; step < 5000; step++ {
		var gap time.Duration
		switch p := rng.IntN(100); {
		case p < 30: // same instant
		case p < 45: // under a millisecond
			gap = time.Duration(rng.IntN(1000)) * time.Microsecond
		case p < 85: // around the period
			gap = time.Duration(rng.Int64N(int64(2 * period)))
		case p < 97:
			gap = time.Duration(rng.Int64N(int64(6 * period)))
		default: // long idle
			gap = time.Duration(rng.Int64N(int64(time.Minute)))
		}
		clk.Advance(gap)
		elapsed += gap
		key := keys[rng.IntN(len(keys))]

		// The model's verdict at the time the Limiter will see.
		wantOK, wantDelay := model.request(key, nowMs(elapsed), false)
		adm, err := l.Admit(key, 0)
		if gotOK := err == nil; gotOK != wantOK {
			t.Fatalf("step %d (%s at %v): admitted %v (err %v), nginx %v", step, key, elapsed, gotOK, err, wantOK)
		}
		if err != nil {
			refused++
			var r *Refusal
			if !errors.As(err, &r) || r.Limit != LimitRate {
				t.Fatalf("step %d: error %v, want a rate Refusal", step, err)
			}
			// RetryAfter is exact: nginx refuses just before, accepts at.
			if ok, _ := model.request(key, nowMs(elapsed+r.RetryAfter-1), false); ok {
				t.Fatalf("step %d: nginx accepts before RetryAfter %v", step, r.RetryAfter)
			}
			if ok, _ := model.request(key, nowMs(elapsed+r.RetryAfter), false); !ok {
				t.Fatalf("step %d: nginx refuses at RetryAfter %v", step, r.RetryAfter)
			}
			continue
		}
		accepted++
		model.request(key, nowMs(elapsed), true)
		if want := time.Duration(wantDelay) * time.Millisecond; adm.Delay != want {
			t.Fatalf("step %d (%s at %v): delay %v, nginx %v", step, key, elapsed, adm.Delay, want)
		}
		adm.Release()
	}
	if accepted == 0 || refused == 0 {
		t.Fatalf("accepted %d, refused %d: the sequence does not exercise both", accepted, refused)
	}
}

// step is one request in a scripted case.
type step struct {
	advance time.Duration // before the request
	tenant  string
	tokens  int
	delay   time.Duration // when admitted
	refuse  string        // the Limit that refuses, "" to admit
	retry   time.Duration // RetryAfter when refused
	hold    bool          // keep the request in flight
}

// runSteps plays steps against l and returns the Releases of the requests
// held.
func runSteps(t *testing.T, l *Limiter, clk *fakeClock, steps []step) []func() {
	t.Helper()
	var held []func()
	for i, s := range steps {
		clk.Advance(s.advance)
		if s.tenant == "" {
			s.tenant = "t"
		}
		adm, err := l.Admit(s.tenant, s.tokens)
		if s.refuse != "" {
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("step %d: admitted (delay %v), want refused by %s", i, adm.Delay, s.refuse)
			}
			if r.Limit != s.refuse || r.RetryAfter != s.retry {
				t.Fatalf("step %d: refused by %s retry %v, want %s retry %v", i, r.Limit, r.RetryAfter, s.refuse, s.retry)
			}
			if adm.Release != nil {
				t.Fatalf("step %d: a refusal came with a Release", i)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v, want admitted", i, err)
		}
		if adm.Delay != s.delay {
			t.Fatalf("step %d: delay %v, want %v", i, adm.Delay, s.delay)
		}
		if s.hold {
			held = append(held, adm.Release)
		} else {
			adm.Release()
		}
	}
	return held
}

func TestLimiterCases(t *testing.T) {
	s := time.Second
	cases := []struct {
		name   string
		limits TenantLimits
		steps  []step
	}{
		{"rate 1 burst 0", TenantLimits{Rate: 1}, []step{
			{},
			{refuse: LimitRate, retry: s},
			{advance: 400 * time.Millisecond, refuse: LimitRate, retry: 600 * time.Millisecond},
			{advance: 600 * time.Millisecond},
		}},
		{"rate 1 burst 2", TenantLimits{Rate: 1, Burst: 2}, []step{
			{}, {delay: s}, {delay: 2 * s},
			{refuse: LimitRate, retry: s},
			{advance: s, delay: 2 * s},
			{refuse: LimitRate, retry: s},
		}},
		{"rate 1 burst 2 nodelay", TenantLimits{Rate: 1, Burst: 2, NoDelay: true}, []step{
			{}, {}, {},
			{refuse: LimitRate, retry: s},
			{advance: s},
			{refuse: LimitRate, retry: s},
		}},
		{"rate 2 half a period", TenantLimits{Rate: 2, Burst: 1}, []step{
			{}, {advance: 250 * time.Millisecond, delay: 250 * time.Millisecond},
		}},
		{"tenants apart", TenantLimits{Rate: 1}, []step{
			{tenant: "a"}, {tenant: "b"}, {tenant: "a", refuse: LimitRate, retry: s},
		}},
		{"concurrency", TenantLimits{MaxConcurrent: 2}, []step{
			{hold: true}, {hold: true},
			{refuse: LimitConcurrency, retry: s},
			{tenant: "other"},
		}},
		{"tokens", TenantLimits{TokensPerMinute: 600}, []step{
			{tokens: 500},
			{tokens: 200, refuse: LimitTokens, retry: 10 * s},
			{advance: 9 * s, tokens: 200, refuse: LimitTokens, retry: s},
			{advance: s, tokens: 200},
			{tokens: 1, refuse: LimitTokens, retry: 100 * time.Millisecond},
			{tenant: "big", tokens: 5000},
			{tenant: "big", tokens: 1, refuse: LimitTokens, retry: 100 * time.Millisecond},
			{tenant: "none", tokens: 0},
		}},
		{"tokens retry rounded up", TenantLimits{TokensPerMinute: 7}, []step{
			{tokens: 7},
			{tokens: 1, refuse: LimitTokens, retry: 8571429 * time.Microsecond}, // 60s/7
			{advance: 8571428 * time.Microsecond, tokens: 1, refuse: LimitTokens, retry: time.Microsecond},
			{advance: time.Microsecond, tokens: 1},
		}},
		{"tokens refill to full only", TenantLimits{TokensPerMinute: 60}, []step{
			{tokens: 60}, {advance: time.Hour, tokens: 60},
			{tokens: 1, refuse: LimitTokens, retry: s},
		}},
		{"order: concurrency first", TenantLimits{MaxConcurrent: 1, Rate: 1, TokensPerMinute: 60}, []step{
			{tokens: 60, hold: true},
			{tokens: 60, refuse: LimitConcurrency, retry: s},
		}},
		{"order: tokens before rate", TenantLimits{Rate: 1, TokensPerMinute: 60}, []step{
			{tokens: 60},
			{tokens: 60, refuse: LimitTokens, retry: 60 * s},
			{tokens: 0, refuse: LimitRate, retry: s},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			runSteps(t, NewLimiter(tc.limits, clk), clk, tc.steps)
		})
	}
}

func TestConcurrencyRelease(t *testing.T) {
	l := NewLimiter(TenantLimits{MaxConcurrent: 2}, newFakeClock())
	a, err := l.Admit("t", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit("t", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Admit("t", 0); err == nil {
		t.Fatal("third admitted with MaxConcurrent 2")
	}
	a.Release()
	a.Release() // frees nothing more
	c, err := l.Admit("t", 0)
	if err != nil {
		t.Fatalf("after a Release: %v", err)
	}
	if _, err := l.Admit("t", 0); err == nil {
		t.Fatal("a second Release freed a second slot")
	}
	c.Release()
	if _, err := l.Admit("t", 0); err != nil {
		t.Fatalf("after the other Release: %v", err)
	}
}

func TestRefusalChargesNothing(t *testing.T) {
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 1, MaxConcurrent: 2, TokensPerMinute: 600}, clk)
	runSteps(t, l, clk, []step{
		{tokens: 500, hold: true},
		// 10 tokens are back, 90 are missing: refused by tokens, which
		// must leave the rate and the second concurrency slot untouched.
		{advance: time.Second, tokens: 200, refuse: LimitTokens, retry: 9 * time.Second},
		{tokens: 0, hold: true},
		// Both slots taken now.
		{tokens: 0, refuse: LimitConcurrency, retry: time.Second},
	})
	// A refusal by the rate must leave the tokens untouched.
	runSteps(t, l, clk, []step{
		{tenant: "u", tokens: 490},
		// Refused by the rate: the 10 tokens must not be charged.
		{tenant: "u", tokens: 10, refuse: LimitRate, retry: time.Second},
		// A second later 10 tokens are back: 480 used, 120 fit exactly
		// (130 would not have, had the refusal charged).
		{tenant: "u", advance: time.Second, tokens: 120},
		{tenant: "u", advance: time.Second, tokens: 11, refuse: LimitTokens, retry: 100 * time.Millisecond},
	})
}

func TestSetKeepsState(t *testing.T) {
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 1, MaxConcurrent: 1, TokensPerMinute: 600}, clk)
	held := runSteps(t, l, clk, []step{
		{tokens: 300, hold: true},
		{refuse: LimitConcurrency, retry: time.Second},
	})
	l.Set(TenantLimits{Rate: 10, MaxConcurrent: 2, TokensPerMinute: 120})
	runSteps(t, l, clk, []step{
		// The new rate: the last request was just now.
		{refuse: LimitRate, retry: 100 * time.Millisecond},
		// The one in flight still counts: one more slot, not two.
		{advance: 100 * time.Millisecond, hold: true},
		{advance: 100 * time.Millisecond, refuse: LimitConcurrency, retry: time.Second},
	})
	held[0]()
	runSteps(t, l, clk, []step{
		// The 300 tokens used are more than the new capacity of 120: the
		// bucket is empty, and 200 ms at 2 a second gave back 0.4.
		{tokens: 1, refuse: LimitTokens, retry: 300 * time.Millisecond},
		{advance: 300 * time.Millisecond, tokens: 1},
	})
	// Limits off and on again: the tenant's buckets start afresh but its
	// request in flight still counts.
	l.Set(TenantLimits{})
	l.Set(TenantLimits{Rate: 1, MaxConcurrent: 2, TokensPerMinute: 60})
	runSteps(t, l, clk, []step{
		{tokens: 60, hold: true},
		{refuse: LimitConcurrency, retry: time.Second},
	})
}

func TestSetRateCarriesExcess(t *testing.T) {
	// A tenant idle long enough is a new key for nginx, whatever the
	// rate; a change of rate must not make it less.
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 1}, clk)
	runSteps(t, l, clk, []step{{}})
	clk.Advance(time.Hour)
	l.Set(TenantLimits{Rate: 2})
	runSteps(t, l, clk, []step{
		{},
		{refuse: LimitRate, retry: 500 * time.Millisecond},
	})
	// An excess left by the old rate drains at the new one from the Set.
	l.Set(TenantLimits{Rate: 1, Burst: 3})
	runSteps(t, l, clk, []step{{tenant: "b"}, {tenant: "b", delay: time.Second}, {tenant: "b", delay: 2 * time.Second}})
	clk.Advance(time.Second) // excess 2 drains to 1
	l.Set(TenantLimits{Rate: 4, Burst: 3})
	runSteps(t, l, clk, []step{
		{tenant: "b", delay: 500 * time.Millisecond}, // excess 1 + 1 at 4/s
	})
}

func TestSetShare(t *testing.T) {
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 10, Burst: 4, MaxConcurrent: 4, TokensPerMinute: 600}, clk)
	l.SetShare(2)
	runSteps(t, l, clk, []step{
		// Rate 5, burst 2.
		{tenant: "r"},
		{tenant: "r", delay: 200 * time.Millisecond},
		{tenant: "r", delay: 400 * time.Millisecond},
		{tenant: "r", refuse: LimitRate, retry: 200 * time.Millisecond},
		// Two in flight.
		{tenant: "c", advance: time.Second, hold: true},
		{tenant: "c", advance: time.Second, hold: true},
		{tenant: "c", advance: time.Second, refuse: LimitConcurrency, retry: time.Second},
		// 300 tokens a minute, 5 a second.
		{tenant: "k", tokens: 1000}, // charged the capacity, 300
		{tenant: "k", tokens: 5, refuse: LimitTokens, retry: time.Second},
	})
	l.SetShare(0) // 1: 600 tokens a minute, rate 10 burst 4
	runSteps(t, l, clk, []step{
		{tenant: "k", tokens: 300, delay: 100 * time.Millisecond},
		{tenant: "k", tokens: 1, refuse: LimitTokens, retry: 100 * time.Millisecond},
	})

	// Rounded up and at least 1.
	for _, tc := range []struct {
		share int
		in    TenantLimits
		want  limitConfig
	}{
		{3, TenantLimits{Rate: 3, Burst: 4, MaxConcurrent: 4, TokensPerMinute: 10},
			limitConfig{rateMilli: 1000, burstMilli: 2000, maxConc: 2, tpm: 4, tokenCap: 4 * tenantTokenUnit, maxTenants: DefaultMaxTenants}},
		{8, TenantLimits{Rate: 1, Burst: 1, MaxConcurrent: 1, TokensPerMinute: 1, MaxTenants: 7},
			limitConfig{rateMilli: 125, burstMilli: 1000, maxConc: 1, tpm: 1, tokenCap: tenantTokenUnit, maxTenants: 7}},
		{2, TenantLimits{Burst: 5, NoDelay: true},
			limitConfig{off: true, noDelay: true, maxTenants: DefaultMaxTenants}},
		{-1, TenantLimits{Rate: 0.29},
			limitConfig{rateMilli: 290, maxTenants: DefaultMaxTenants}},
	} {
		l := NewLimiter(tc.in, clk)
		l.SetShare(tc.share)
		if got := *l.cfg; got != tc.want {
			t.Errorf("SetShare(%d) of %+v: %+v, want %+v", tc.share, tc.in, got, tc.want)
		}
	}
}

func TestMaxTenants(t *testing.T) {
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 1, MaxConcurrent: 1, MaxTenants: 3}, clk)
	runSteps(t, l, clk, []step{{tenant: "a"}, {tenant: "b"}, {tenant: "c"}})
	clk.Advance(2 * time.Second) // a, b, c all drained
	runSteps(t, l, clk, []step{
		{tenant: "b"}, // b seen again, not drained now
		{tenant: "d"}, // evicts a, the longest idle drained
		{tenant: "e"}, // evicts c, drained
		{tenant: "f"}, // none drained: evicts the least recently seen, b
		{tenant: "b"}, // b is new again, so not refused; evicts d
		{tenant: "e", refuse: LimitRate, retry: time.Second}, // still tracked
	})
	if n := l.Tenants(); n != 3 {
		t.Fatalf("Tenants() = %d, want 3", n)
	}

	// All three in flight: new tenants share the overflow state.
	clk.Advance(time.Hour)
	held := runSteps(t, l, clk, []step{
		{tenant: "e", hold: true}, {tenant: "f", hold: true}, {tenant: "b", hold: true},
		{tenant: "x", hold: true},
		{tenant: "y", refuse: LimitConcurrency, retry: time.Second},
	})
	if n := l.Tenants(); n != 3 {
		t.Fatalf("Tenants() = %d with all in flight, want 3", n)
	}
	held[3]() // x's Release frees the overflow slot
	runSteps(t, l, clk, []step{{tenant: "y", advance: time.Second}})
	held[0]() // e idle again: the next new tenant takes its place
	runSteps(t, l, clk, []step{{tenant: "z"}})
	l.mu.Lock()
	_, tracked := l.tenants["e"]
	l.mu.Unlock()
	if tracked {
		t.Fatal("e still tracked: z should have taken its place")
	}
	for _, r := range held {
		r()
	}

	// Many tenants, at random times: never more than MaxTenants, and the
	// limits hold for the tenant seen last.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		clk.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
		name := "t" + strconv.Itoa(rng.IntN(50))
		if adm, err := l.Admit(name, 0); err == nil {
			adm.Release()
		}
		if n := l.Tenants(); n > 3 {
			t.Fatalf("after %d requests: Tenants() = %d > 3", i, n)
		}
		if _, err := l.Admit(name, 0); err == nil {
			t.Fatalf("after %d requests: %s admitted twice at once at rate 1", i, name)
		}
	}
	checkIdleList(t, l)
}

// checkIdleList checks that the idle list holds exactly the tracked
// tenants with nothing in flight.
func checkIdleList(t *testing.T, l *Limiter) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for st := l.idle.next; st != &l.idle; st = st.next {
		if st.next.prev != st || l.tenants[st.key] != st || st.inflight != 0 {
			t.Fatalf("idle list broken at %q", st.key)
		}
		n++
	}
	idle := 0
	for _, st := range l.tenants {
		if st.inflight == 0 {
			idle++
		}
	}
	if n != idle {
		t.Fatalf("idle list has %d tenants, the table %d idle", n, idle)
	}
}

func TestZeroLimitsNoAlloc(t *testing.T) {
	l := NewLimiter(TenantLimits{MaxTenants: 5}, nil)
	check := func() {
		t.Helper()
		allocs := testing.AllocsPerRun(1000, func() {
			adm, err := l.Admit("tenant", 100)
			if err != nil || adm.Delay != 0 {
				t.Fatalf("zero limits: %v, delay %v", err, adm.Delay)
			}
			adm.Release()
		})
		if allocs != 0 {
			t.Fatalf("zero limits: %v allocations per Admit", allocs)
		}
		if n := l.Tenants(); n != 0 {
			t.Fatalf("zero limits: %d tenants tracked", n)
		}
	}
	check()
	l.Set(TenantLimits{MaxConcurrent: 1})
	l.Set(TenantLimits{})
	check()
}

func TestRefusalError(t *testing.T) {
	for _, tc := range []struct {
		r    Refusal
		want string
	}{
		{Refusal{LimitRate, 2 * time.Second}, "tenant limit rate exceeded; retry after 2s"},
		{Refusal{LimitTokens, 1500*time.Millisecond + 1}, "tenant limit tokens exceeded; retry after 1.501s"},
		{Refusal{LimitConcurrency, time.Second}, "tenant limit concurrency exceeded; retry after 1s"},
	} {
		var err error = &tc.r
		if got := err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

func TestLimiterConcurrentUse(t *testing.T) {
	clk := newFakeClock()
	l := NewLimiter(TenantLimits{Rate: 1000, Burst: 10, MaxConcurrent: 3, TokensPerMinute: 60000, MaxTenants: 5}, clk)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 0))
			var held []func()
			for range 2000 {
				adm, err := l.Admit("t"+strconv.Itoa(rng.IntN(12)), rng.IntN(200))
				if err == nil {
					held = append(held, adm.Release)
				}
				if len(held) > 0 && rng.IntN(2) == 0 {
					i := rng.IntN(len(held))
					held[i]()
					held[i]() // twice: no effect
					held = append(held[:i], held[i+1:]...)
				}
			}
			for _, r := range held {
				r()
			}
		})
	}
	wg.Go(func() {
		for i := range 500 {
			clk.Advance(time.Millisecond)
			switch i % 50 {
			case 10:
				l.SetShare(2)
			case 20:
				l.Set(TenantLimits{Rate: 500, MaxConcurrent: 2, MaxTenants: 3})
			case 30:
				l.SetShare(1)
			case 40:
				l.Set(TenantLimits{Rate: 1000, Burst: 10, MaxConcurrent: 3, TokensPerMinute: 60000, MaxTenants: 5})
			}
			runtime.Gosched()
		}
	})
	wg.Wait()
	checkIdleList(t, l)
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, st := range l.tenants {
		if st.inflight != 0 {
			t.Errorf("tenant %s: %d in flight after every Release", k, st.inflight)
		}
	}
	if l.overflow != nil && l.overflow.inflight != 0 {
		t.Errorf("overflow: %d in flight after every Release", l.overflow.inflight)
	}
}

// TestTenantMemory measures what a tracked tenant costs (the figure in the
// Limiter's doc comment).
func TestTenantMemory(t *testing.T) {
	const n = 10000
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("tenant-%08d", i) // a typical id length
	}
	clk := newFakeClock()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	l := NewLimiter(TenantLimits{Rate: 10, Burst: 5, MaxConcurrent: 8, TokensPerMinute: 100000}, clk)
	for _, name := range names {
		adm, err := l.Admit(name, 100)
		if err != nil {
			t.Fatal(err)
		}
		adm.Release()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%d tenants: %.0f bytes each (state %d bytes)", l.Tenants(), per, unsafe.Sizeof(tenantState{}))
	if per > 400 {
		t.Errorf("%.0f bytes per tenant, want about 150", per)
	}
	runtime.KeepAlive(l)
}

func BenchmarkAdmit(b *testing.B) {
	// As nginx's, the excess drains per whole millisecond: the burst must
	// hold the requests of one millisecond.
	l := NewLimiter(TenantLimits{Rate: 1e9, Burst: 1e6, MaxConcurrent: 100, TokensPerMinute: 1e9}, nil)
	b.ReportAllocs()
	for b.Loop() {
		adm, err := l.Admit("tenant", 100)
		if err != nil {
			b.Fatal(err)
		}
		adm.Release()
	}
}
