package flow

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TenantLimits are the limits each tenant is held to; a zero field is no
// limit.
type TenantLimits struct {
	// Rate is the sustained request rate, in requests per second, as
	// nginx's limit_req rate.
	Rate float64
	// Burst is how many requests above Rate are delayed (or served at
	// once with NoDelay) before any is refused, as limit_req's burst. It
	// only counts when Rate is set.
	Burst int
	// NoDelay is limit_req's nodelay: the requests within Burst go at
	// once rather than spaced out at Rate.
	NoDelay bool
	// MaxConcurrent is how many requests of a tenant may be in flight at
	// once, as nginx's limit_conn.
	MaxConcurrent int
	// TokensPerMinute is the prompt tokens a tenant may send per minute.
	TokensPerMinute int
	// MaxTenants is how many tenants' state is kept at once, a bound on
	// memory; 0 means DefaultMaxTenants.
	MaxTenants int
}

// DefaultMaxTenants is the number of tenants tracked when
// TenantLimits.MaxTenants is 0.
const DefaultMaxTenants = 10000

// The limits a Refusal names.
const (
	LimitRate        = "rate"
	LimitConcurrency = "concurrency"
	LimitTokens      = "tokens"
)

// Refusal is the error Admit returns when a request is over a limit.
type Refusal struct {
	// Limit is the limit that refused: LimitRate, LimitConcurrency or
	// LimitTokens.
	Limit string
	// RetryAfter is how long until the same request could pass, as far as
	// the limit can tell (for LimitConcurrency it cannot: 1s).
	RetryAfter time.Duration
}

// Error implements error.
func (r *Refusal) Error() string {
	d := r.RetryAfter
	if rem := d % time.Millisecond; rem != 0 {
		d += time.Millisecond - rem // whole milliseconds, rounded up
	}
	return fmt.Sprintf("tenant limit %s exceeded; retry after %s", r.Limit, d)
}

// Admission is a request that Admit let through.
type Admission struct {
	// Delay is how long the request must wait before it is forwarded:
	// limit_req without nodelay spaces the excess out at Rate.
	Delay time.Duration
	// Release must be called once the request ends; it frees the
	// request's concurrency slot. Calls after the first do nothing.
	Release func()
}

// Limiter holds each tenant to a TenantLimits. It is safe for concurrent
// use.
//
// The request rate is nginx's limit_req, computed with nginx's own
// arithmetic rather than with golang.org/x/time/rate: nginx keeps an
// "excess" in milli-requests that drains at the rate per whole millisecond
// elapsed, refuses when one more request would put it above the burst, and
// delays an accepted request by excess/rate. A token bucket of capacity
// Burst+1 accepts the same requests, but x/time/rate works in float64
// seconds (so a request landing exactly on the boundary can go either way),
// its Reservation delay is not nginx's excess/rate, and a reload would keep
// its tokens where nginx keeps the excess. The formula is a few integer
// lines and matches nginx to the millisecond. The prompt tokens per minute
// are a token bucket in exact integer arithmetic (microseconds), so no
// dependency is needed for either.
//
// Memory: a tracked tenant costs about 140 bytes: its state (72 bytes, an
// 80-byte allocation: name, in-flight count, rate excess and time, token
// deficit and time, idle-list links), a copy of its name (16 bytes for a
// 15-byte id) and its slot in the map (about 30 bytes with the map's spare
// room); TestTenantMemory measures it. At most MaxTenants tenants are
// tracked (about 1.4 MB at the default 10000), plus one overflow state
// shared by all new tenants while every tracked one has requests in
// flight. An admitted request allocates its Release (two small objects,
// 40 bytes) unless every limit is off.
type Limiter struct {
	fast atomic.Pointer[limitConfig] // cfg, read without mu for the all-off check

	clock Clock
	epoch time.Time // times are kept as offsets from it, with its monotonic reading

	mu       sync.Mutex
	base     TenantLimits
	share    int
	cfg      *limitConfig
	tenants  map[string]*tenantState
	idle     tenantState  // sentinel of the list of tenants with nothing in flight, least recently seen first
	overflow *tenantState // shared by new tenants when the table is full and none can be evicted
}

// limitConfig is a TenantLimits as applied: divided by the share, in the
// units the arithmetic uses.
type limitConfig struct {
	off        bool  // no limit at all
	rateMilli  int64 // milli-requests per second, as nginx keeps its rate; 0 is off
	burstMilli int64 // milli-requests
	noDelay    bool
	maxConc    int
	tpm        int64 // tokens per minute, which is also the refill in token units per microsecond
	tokenCap   int64 // tpm tokens, in token units
	maxTenants int
}

// tenantTokenUnit is one prompt token in the units of the token deficit:
// a bucket of TokensPerMinute tokens refills TokensPerMinute units per
// microsecond, so whole microseconds refill whole units.
const tenantTokenUnit = 60 * 1000 * 1000

// Caps that keep the integer arithmetic from overflowing, far above any
// real limit.
const (
	limMaxRate   = 1e12    // requests per second
	limMaxBurst  = 1 << 40 // requests
	limMaxTokens = 1e11    // tokens per minute
)

// limFreshExcess is the rate excess of a tenant with no recent request: as
// nginx's new key, the next request leaves an excess of 0.
const limFreshExcess = -1000

// limEvictScan is how many of the least recently seen idle tenants the
// eviction looks at for one whose state no longer matters, so that a new
// tenant costs a bounded time when the table is full.
const limEvictScan = 64

// tenantState is what the Limiter keeps of a tenant.
type tenantState struct {
	key      string
	inflight int
	// excess is nginx's excess in milli-requests as of rateLast (ms since
	// the epoch). Below 0 it is a credit left by a change of rate: any
	// value at or below limFreshExcess is a key nginx would create anew.
	excess   int64
	rateLast int64
	// deficit is how far the token bucket is below full, in
	// tenantTokenUnit per token, as of tokLast (µs since the epoch).
	deficit    int64
	tokLast    int64
	prev, next *tenantState // idle list links, set only while inflight == 0
}

// NewLimiter returns a Limiter holding each tenant to l, telling the time
// by c (nil is SystemClock).
func NewLimiter(l TenantLimits, c Clock) *Limiter {
	if c == nil {
		c = SystemClock{}
	}
	lim := &Limiter{
		clock:   c,
		epoch:   c.Now(),
		base:    l,
		share:   1,
		tenants: make(map[string]*tenantState),
	}
	lim.idle.prev, lim.idle.next = &lim.idle, &lim.idle
	lim.cfg = newLimitConfig(l, 1)
	lim.fast.Store(lim.cfg)
	return lim
}

// Set replaces the limits, as a reload: each tenant keeps its state (its
// requests in flight, its rate excess and its used tokens, each bucket
// resized to the new limits).
func (l *Limiter) Set(lim TenantLimits) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.base = lim
	l.apply()
}

// SetShare tells the Limiter it is one of n instances in a cluster, each
// seeing a share of every tenant's traffic: each rate is divided by n, and
// each burst, concurrency and token budget too, rounded up and at least 1
// where the limit is set. n < 1 means 1.
func (l *Limiter) SetShare(n int) {
	if n < 1 {
		n = 1
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.share = n
	l.apply()
}

// Tenants returns how many tenants are tracked now, at most MaxTenants;
// the overflow state is not counted.
func (l *Limiter) Tenants() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tenants)
}

// limNoRelease is the Release of an Admission that holds nothing.
func limNoRelease() {}

// Admit applies the limits to one request of tenant with promptTokens
// prompt tokens. On success it returns an Admission whose Delay is how long
// the request must wait before it is forwarded and whose Release must be
// called once when the request ends. On refusal it returns a *Refusal and a
// zero Admission, and charges nothing. The checks run in the order
// concurrency, tokens, rate; a prompt larger than TokensPerMinute is charged
// TokensPerMinute, so it passes when the tenant's bucket is full.
func (l *Limiter) Admit(tenant string, promptTokens int) (Admission, error) {
	if l.fast.Load().off {
		return Admission{Release: limNoRelease}, nil
	}
	l.mu.Lock()
	cfg := l.cfg
	if cfg.off {
		l.mu.Unlock()
		return Admission{Release: limNoRelease}, nil
	}
	// Read under mu so that the state's times only move forward.
	d := l.clock.Now().Sub(l.epoch)
	st := l.lookup(tenant, cfg, d)

	if cfg.maxConc > 0 && st.inflight >= cfg.maxConc {
		l.mu.Unlock()
		return Admission{}, &Refusal{Limit: LimitConcurrency, RetryAfter: time.Second}
	}

	nowUs := limFloorDiv(int64(d), int64(time.Microsecond))
	var deficit int64
	if cfg.tpm > 0 {
		deficit = cfg.deficitAt(st, nowUs)
		cost := int64(max(promptTokens, 0))
		cost = min(cost, cfg.tpm) * tenantTokenUnit
		if deficit > cfg.tokenCap-cost {
			missing := deficit - (cfg.tokenCap - cost)
			us := (missing + cfg.tpm - 1) / cfg.tpm
			l.mu.Unlock()
			return Admission{}, &Refusal{
				Limit:      LimitTokens,
				RetryAfter: time.Duration(nowUs+us)*time.Microsecond - d,
			}
		}
		deficit += cost
	}

	nowMs := limFloorDiv(int64(d), int64(time.Millisecond))
	var excess, ms int64
	if cfg.rateMilli > 0 {
		excess, ms = cfg.excessAt(st, nowMs)
		if excess > cfg.burstMilli {
			// One more request passes once rate*elapsed/1000 >= need.
			need := st.excess + 1000 - cfg.burstMilli
			at := st.rateLast + (1000*need+cfg.rateMilli-1)/cfg.rateMilli
			retry := limMillis(at-nowMs) - (d - time.Duration(nowMs)*time.Millisecond)
			l.mu.Unlock()
			return Admission{}, &Refusal{Limit: LimitRate, RetryAfter: max(retry, time.Nanosecond)}
		}
	}

	// Every check passed: charge them all.
	var delay time.Duration
	if cfg.tpm > 0 {
		if st.deficit == 0 || nowUs > st.tokLast {
			st.tokLast = nowUs
		}
		st.deficit = deficit
	}
	if cfg.rateMilli > 0 {
		if st.excess <= limFreshExcess || ms != 0 {
			st.rateLast = nowMs // as nginx: only once a millisecond has passed
		}
		st.excess = excess
		if !cfg.noDelay {
			delay = limMillis(excess * 1000 / cfg.rateMilli) // whole milliseconds, as nginx
		}
	}
	st.inflight++
	if st.inflight == 1 && st != l.overflow {
		l.unlinkIdle(st)
	}
	l.mu.Unlock()
	r := &limRelease{l: l, st: st}
	return Admission{Delay: delay, Release: r.release}, nil
}

// limRelease frees one admitted request's concurrency slot, once.
type limRelease struct {
	l    *Limiter
	st   *tenantState
	done atomic.Bool
}

func (r *limRelease) release() {
	if !r.done.CompareAndSwap(false, true) {
		return
	}
	l := r.l
	l.mu.Lock()
	r.st.inflight--
	if r.st.inflight == 0 && r.st != l.overflow {
		l.pushIdle(r.st)
	}
	l.mu.Unlock()
}

// lookup returns tenant's state, tracking it anew if need be. l.mu is held.
func (l *Limiter) lookup(tenant string, cfg *limitConfig, d time.Duration) *tenantState {
	if st, ok := l.tenants[tenant]; ok {
		if st.inflight == 0 {
			l.unlinkIdle(st)
			l.pushIdle(st)
		}
		return st
	}
	if len(l.tenants) >= cfg.maxTenants {
		l.evict(cfg, d)
		if len(l.tenants) >= cfg.maxTenants {
			if l.overflow == nil {
				l.overflow = &tenantState{excess: limFreshExcess}
			}
			return l.overflow
		}
	}
	// A copy: the caller's string may share a buffer it reuses.
	key := strings.Clone(tenant)
	st := &tenantState{key: key, excess: limFreshExcess}
	l.tenants[key] = st
	l.pushIdle(st)
	return st
}

// evict drops one tracked tenant with nothing in flight: of the least
// recently seen, the first whose state no longer matters (the next request
// would find it as a new tenant's), else the least recently seen. It does
// nothing if every tracked tenant has requests in flight. l.mu is held.
func (l *Limiter) evict(cfg *limitConfig, d time.Duration) {
	victim := l.idle.next
	if victim == &l.idle {
		return
	}
	nowMs := limFloorDiv(int64(d), int64(time.Millisecond))
	nowUs := limFloorDiv(int64(d), int64(time.Microsecond))
	st := victim
	for i := 0; i < limEvictScan && st != &l.idle; i, st = i+1, st.next {
		if cfg.settled(st, nowMs, nowUs) {
			victim = st
			break
		}
	}
	l.unlinkIdle(victim)
	delete(l.tenants, victim.key)
}

// apply recomputes the limits from l.base and l.share and carries each
// tenant's state over to them. l.mu is held.
func (l *Limiter) apply() {
	old, cfg := l.cfg, newLimitConfig(l.base, l.share)
	if !cfg.off || !old.off {
		d := l.clock.Now().Sub(l.epoch)
		nowMs := limFloorDiv(int64(d), int64(time.Millisecond))
		nowUs := limFloorDiv(int64(d), int64(time.Microsecond))
		for _, st := range l.tenants {
			retune(st, old, cfg, nowMs, nowUs)
		}
		if l.overflow != nil {
			retune(l.overflow, old, cfg, nowMs, nowUs)
		}
		for len(l.tenants) > cfg.maxTenants && l.idle.next != &l.idle {
			l.evict(cfg, d)
		}
	}
	l.cfg = cfg
	l.fast.Store(cfg)
}

// retune carries st from the limits old to cfg.
func retune(st *tenantState, old, cfg *limitConfig, nowMs, nowUs int64) {
	switch {
	case cfg.rateMilli == 0 || old.rateMilli == 0:
		st.excess = limFreshExcess
	case cfg.rateMilli != old.rateMilli:
		// Drain the excess at the old rate up to now; the new rate drains
		// it from now on. What is below limFreshExcess makes no difference.
		// excessAt counts one more request: less that, it is the excess
		// now, floored at limFreshExcess.
		excess, _ := old.excessAt(st, nowMs)
		st.excess, st.rateLast = excess-1000, nowMs
	}
	switch {
	case cfg.tpm == 0 || old.tpm == 0:
		st.deficit = 0
	case cfg.tpm != old.tpm:
		st.deficit = min(old.deficitAt(st, nowUs), cfg.tokenCap)
		st.tokLast = nowUs
	}
}

// excessAt returns nginx's excess, in milli-requests, after one more
// request of st at nowMs, and the elapsed milliseconds nginx would count:
// the stored excess, less rate*ms/1000 (an integer division), plus 1000,
// and 0 if that is negative. As nginx, a clock gone back by up to a minute
// counts as 0 ms, by more as 1 ms.
func (c *limitConfig) excessAt(st *tenantState, nowMs int64) (excess, ms int64) {
	ms = nowMs - st.rateLast
	if ms < -60000 {
		ms = 1
	} else if ms < 0 {
		ms = 0
	}
	e := st.excess + 1000
	if e <= 0 || ms > e*1000/c.rateMilli {
		return 0, ms // drained; also keeps rate*ms from overflowing
	}
	return max(e-c.rateMilli*ms/1000, 0), ms
}

// deficitAt returns st's token deficit at nowUs.
func (c *limitConfig) deficitAt(st *tenantState, nowUs int64) int64 {
	e := nowUs - st.tokLast
	if st.deficit == 0 || e <= 0 {
		return st.deficit
	}
	if e > st.deficit/c.tpm {
		return 0
	}
	return max(st.deficit-c.tpm*e, 0)
}

// settled reports whether st is as a new tenant's would be: no request in
// flight, the rate excess drained and the token bucket full.
func (c *limitConfig) settled(st *tenantState, nowMs, nowUs int64) bool {
	if st.inflight > 0 {
		return false
	}
	if c.rateMilli > 0 {
		// Drained to a new key's when one more request would leave no
		// excess.
		if excess, _ := c.excessAt(st, nowMs); excess > 0 {
			return false
		}
	}
	return c.tpm == 0 || c.deficitAt(st, nowUs) == 0
}

// newLimitConfig returns lim as applied by one of share instances.
func newLimitConfig(lim TenantLimits, share int) *limitConfig {
	n := int64(max(share, 1))
	c := &limitConfig{maxTenants: lim.MaxTenants, noDelay: lim.NoDelay}
	if c.maxTenants <= 0 {
		c.maxTenants = DefaultMaxTenants
	}
	if r := lim.Rate; r > 0 && !math.IsInf(r, 1) {
		r = min(r/float64(n), limMaxRate)
		// nginx truncates its rate to whole milli-requests per second;
		// the nudge keeps 0.29*1000 = 289.99999999999997 at 290.
		c.rateMilli = max(int64(math.Floor(r*1000+1e-6)), 1)
		c.burstMilli = min(limCeilDiv(int64(max(lim.Burst, 0)), n), limMaxBurst) * 1000
	}
	if lim.MaxConcurrent > 0 {
		c.maxConc = int(limCeilDiv(int64(lim.MaxConcurrent), n))
	}
	if lim.TokensPerMinute > 0 {
		c.tpm = min(limCeilDiv(int64(lim.TokensPerMinute), n), limMaxTokens)
		c.tokenCap = c.tpm * tenantTokenUnit
	}
	c.off = c.rateMilli == 0 && c.maxConc == 0 && c.tpm == 0
	return c
}

// limCeilDiv returns a/n rounded up, for a >= 0 and n >= 1.
func limCeilDiv(a, n int64) int64 {
	q := a / n
	if a%n != 0 {
		q++
	}
	return q
}

// limMillis returns ms milliseconds, saturated at the longest Duration.
func limMillis(ms int64) time.Duration {
	if ms > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// limFloorDiv returns a/n rounded down, for n >= 1.
func limFloorDiv(a, n int64) int64 {
	q := a / n
	if a%n != 0 && a < 0 {
		q--
	}
	return q
}

// pushIdle appends st to the idle list as the most recently seen.
func (l *Limiter) pushIdle(st *tenantState) {
	last := l.idle.prev
	st.prev, st.next = last, &l.idle
	last.next = st
	l.idle.prev = st
}

// unlinkIdle takes st off the idle list.
func (l *Limiter) unlinkIdle(st *tenantState) {
	st.prev.next = st.next
	st.next.prev = st.prev
	st.prev, st.next = nil, nil
}
