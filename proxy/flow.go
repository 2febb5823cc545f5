package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/flow"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
)

// Flow control (Options.Flow). A routed request is first held to its
// tenant's limits (flow.Limiter: a refusal is 429 with Retry-After and
// the limit named; a request past the rate within the burst waits its
// turn). Then, when saturation is measured (MaxWaiting, MaxRunning or MaxKV) and
// every available replica that could serve it is saturated, or others
// wait already, it waits in the queue (flow.Queue: strict between
// priorities, fair between tenants) until the dispatcher (ServeFlow)
// finds a replica with room; only then is it routed, with the cache and
// load of that moment. A client that leaves the queue is answered 499 at
// once; a request shed for a more urgent one gets 429, one past
// max_wait or refused by a full queue 503, each with Retry-After.

// FlowOptions configure flow control; the zero value turns it off.
type FlowOptions struct {
	// MaxWaiting makes a replica saturated while the requests waiting in
	// its engine at the last metrics poll, plus the growth since of
	// kvroute's requests in flight to it, reach it; 0: not by its queue.
	MaxWaiting int
	// MaxRunning makes a replica saturated while its engine's requests
	// running and waiting at the last poll, plus the change since of
	// kvroute's requests in flight to it, reach it, for a tenant that
	// holds its fair share (share.go), which while other tenants are
	// active also waits for the prompts sent to the replica to be
	// prefilled; 0: not by the batch.
	MaxRunning int
	// LocalityWait is how long a queued request waits for the saturated
	// replica that holds its prefix while others have room (locality.go).
	LocalityWait time.Duration
	// MaxKV makes a replica saturated while its KV cache usage reaches
	// it; 0: not by KV usage.
	MaxKV float64
	// Queue bounds the queue.
	Queue flow.QueueLimits
	// Limits hold each tenant; Share divides them among the instances of
	// a cluster (flow.Limiter.SetShare).
	Limits flow.TenantLimits
	// PriorityHeader names the request header holding an integer
	// priority, lower first; empty: none.
	PriorityHeader string
	// Tenant says who a request's tenant is.
	Tenant TenantSource
}

// TenantSource says who a request's tenant is: the value of the header
// Header names, or with APIKey or User a digest of the API key or the
// request's user field. None set: one tenant ("").
type TenantSource struct {
	Header string
	APIKey bool
	User   bool
}

// queues reports whether saturation is measured.
func (f *FlowOptions) queues() bool { return f.MaxWaiting > 0 || f.MaxRunning > 0 || f.MaxKV > 0 }

// flowState is the proxy's flow control: the limiter and the queue live
// across reloads (SetOptions sets their limits).
type flowState struct {
	limiter *flow.Limiter
	queue   *flow.Queue
	wake    chan struct{} // a request ended: capacity may have freed
	mu      sync.Mutex
	shed    map[string]int64 // refusals by reason, for /debug/flow
	// tenants are the tenants with requests queued or in flight while
	// max_running is set (share.go), under mu.
	tenants map[string]*tenantLoad
	swept   time.Time // the last sweep of tenants (share.go), under mu
	gen     uint64    // bumped whenever tenants' counts change, under mu
	under   underMemo // standOf's last look for a tenant under its share, under mu
	// reserved counts, per replica, the requests the dispatcher let go
	// to it that have not taken its in-flight slot yet (under mu): until
	// they do, the replica's load does not show them, and a later round
	// would let another go for the same room.
	reserved map[*backends.Replica]int
}

func newFlowState(o *FlowOptions) *flowState {
	return &flowState{
		limiter:  flow.NewLimiter(o.Limits, nil),
		queue:    flow.NewQueue(o.Queue, nil),
		wake:     make(chan struct{}, 1),
		shed:     map[string]int64{},
		tenants:  map[string]*tenantLoad{},
		reserved: map[*backends.Replica]int{},
	}
}

// reserve counts fr as let go to rep and not yet in its in-flight slot.
func (f *flowState) reserve(fr *flowRequest, rep *backends.Replica) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reserved[rep]++
	fr.reservedOn = rep
}

// unreserve takes fr's reservation back, once; the request has taken its
// replica's slot, or ends without one.
func (f *flowState) unreserve(fr *flowRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep := fr.reservedOn
	if rep == nil {
		return
	}
	fr.reservedOn = nil
	if f.reserved[rep]--; f.reserved[rep] <= 0 {
		delete(f.reserved, rep)
	}
}

// reservations returns a copy of the reservations, less fr's own (nil fr:
// none left out), or nil when there are none to count.
func (f *flowState) reservations(fr *flowRequest) map[*backends.Replica]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reserved) == 0 {
		return nil
	}
	out := make(map[*backends.Replica]int, len(f.reserved))
	for rep, n := range f.reserved {
		if fr != nil && fr.reservedOn == rep {
			n--
		}
		if n > 0 {
			out[rep] = n
		}
	}
	return out
}

// Flow refusal reasons (flowObserver.FlowRefused, /debug/flow).
const (
	refusedQueueFull = "queue_full"
	refusedShed      = "shed"
	refusedTimeout   = "queue_timeout"
)

// flowObserver is an Observer that also counts flow control's work.
type flowObserver interface {
	// FlowRefused counts a request refused by flow control: by a tenant
	// limit (flow.LimitRate, flow.LimitConcurrency, flow.LimitTokens) or
	// by the queue (queue_full, shed, queue_timeout).
	FlowRefused(reason string)
	// FlowWaited records how long a request waited in the queue before
	// dispatch, by its priority (bounded: "high" < 0, "normal" 0, "low" > 0).
	FlowWaited(band string, d time.Duration)
}

// bandLabel is the metrics label of a priority.
func bandLabel(priority int) string {
	switch {
	case priority < 0:
		return "high"
	case priority > 0:
		return "low"
	}
	return "normal"
}

// refused counts a refusal.
func (p *Proxy) flowRefused(reason string) {
	f := p.flow
	f.mu.Lock()
	f.shed[reason]++
	f.mu.Unlock()
	if fo, ok := p.obs.(flowObserver); ok {
		fo.FlowRefused(reason)
	}
}

// tenantOf names the request's tenant as opts say; apiKey is the
// client's bearer token, read before admit consumed it.
func tenantOf(ctx *fasthttp.RequestCtx, user string, apiKey []byte, o *TenantSource) string {
	switch {
	case o.Header != "":
		return logBytes(ctx.Request.Header.Peek(o.Header))
	case o.APIKey:
		if len(apiKey) == 0 {
			return ""
		}
		sum := sha256.Sum256(apiKey)
		return "key:" + hex.EncodeToString(sum[:8])
	case o.User:
		return logTrunc(user)
	}
	return ""
}

// priorityOf is the request's priority: the configured header's integer,
// else the body's priority field, else 0.
func priorityOf(ctx *fasthttp.RequestCtx, body int, hasBody bool, o *FlowOptions) int {
	if o.PriorityHeader != "" {
		if v := ctx.Request.Header.Peek(o.PriorityHeader); len(v) > 0 {
			if n, err := strconv.Atoi(string(v)); err == nil {
				return n
			}
		}
	}
	if hasBody {
		return body
	}
	return 0
}

// flowRequest is what gate needs of a routed request.
type flowRequest struct {
	tenant   string
	priority int
	tokens   int // prompt tokens, for the token budget
	bytes    int64
	rreq     *router.Request
	// shared: counted in its tenant's load (share.go); held: let go.
	// Both under the flowState's mu.
	shared, held bool
	queued       time.Time // when it entered the queue (locality.go)
	// reservedOn is the replica the dispatcher let it go to, until it
	// takes that replica's slot (flowState.reserve), under mu.
	reservedOn *backends.Replica
}

// gate applies flow control to a routed request before it is forwarded.
// It returns false once it has answered the request itself (refused,
// timed out, or its client gone), finished included; else the request
// goes on, and o.flowDone, if set, must run when it ends.
func (p *Proxy) gate(ctx *fasthttp.RequestCtx, o *outcome, fr *flowRequest, opts *Options) bool {
	f := p.flow
	fo := &opts.Flow
	adm, err := f.limiter.Admit(fr.tenant, fr.tokens)
	if err != nil {
		var ref *flow.Refusal
		if errors.As(err, &ref) {
			p.flowRefused(ref.Limit)
			p.failRetry(ctx, o, oai.NewError(fasthttp.StatusTooManyRequests, "rate_limit_exceeded", "tenant_limit_"+ref.Limit,
				"tenant limit exceeded: "+limitText(ref.Limit, fo)+"; retry later"), ref.RetryAfter)
			return false
		}
		p.fail(ctx, o, oai.NewError(fasthttp.StatusInternalServerError, "server_error", "flow_error", err.Error()))
		return false
	}
	o.flowDone = adm.Release
	if adm.Delay <= 0 && !fo.queues() {
		return true // flow control's every request when it only limits
	}
	var watch *clientWatch
	defer func() { watch.Stop() }() // the watch started below, if any
	if adm.Delay > 0 {
		// limit_req without nodelay: the excess waits its turn.
		watch = watchClient(ctx.Conn())
		t := time.NewTimer(adm.Delay)
		select {
		case <-t.C:
		case <-watch.Context().Done():
			t.Stop()
			p.fail(ctx, o, errClientLeft)
			return false
		}
	}
	if !fo.queues() {
		return true
	}
	if fo.MaxRunning > 0 {
		f.shareJoin(fr)
		release := o.flowDone
		o.flowDone = func() {
			f.shareLeave(fr)
			release()
		}
	}
	// With others' requests queued, a tenant under its fair share whose
	// own are not, and nothing more urgent waiting, goes at once when a
	// replica has room for it: the queue's round-robin would only make it
	// wait for the dispatcher's next round.
	stand := p.stand(fr, fo)
	if n, _ := f.queue.Len(); (n == 0 || stand == shareUnder && !f.queue.Ahead(fr.priority, fr.tenant)) &&
		p.bindLate(o, fr, fo, stand) {
		f.shareHold(fr)
		return true
	}
	fr.queued = time.Now()
	it := &flow.Item{Priority: fr.priority, Flow: fr.tenant, Bytes: fr.bytes, Value: fr}
	if err := f.queue.Push(it); err != nil {
		p.flowRefused(refusedQueueFull)
		p.failRetry(ctx, o, oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", refusedQueueFull,
			"every replica is saturated and kvroute's queue is full (flow.max_queued, flow.max_queued_bytes); retry later"), time.Second)
		return false
	}
	p.wakeFlow()
	if watch == nil {
		watch = watchClient(ctx.Conn())
	}
	queued := time.Now()
	switch err := f.queue.Wait(watch.Context(), it); {
	case err == nil:
		if obs, ok := p.obs.(flowObserver); ok {
			obs.FlowWaited(bandLabel(fr.priority), time.Since(queued))
		}
		p.bindLate(o, fr, fo, p.stand(fr, fo)) // where its tenant stands now
		o.unreserve = func() { f.unreserve(fr) }
		return true
	case errors.Is(err, flow.ErrShed):
		p.flowRefused(refusedShed)
		p.failRetry(ctx, o, oai.NewError(fasthttp.StatusTooManyRequests, "rate_limit_exceeded", refusedShed,
			"every replica is saturated and a more urgent request, or one of a tenant with fewer waiting, took this one's place in kvroute's queue; retry later"), time.Second)
	case errors.Is(err, flow.ErrTimeout):
		p.flowRefused(refusedTimeout)
		p.failRetry(ctx, o, oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", refusedTimeout,
			"every replica stayed saturated for flow.max_wait ("+fo.Queue.MaxWait.String()+"); retry later"), time.Second)
	default:
		p.fail(ctx, o, errClientLeft)
	}
	return false
}

// bindLate reports whether some replica that could serve the request
// has room, and if so keeps the request off the saturated ones (o.avoid,
// which forward counts as tried): the policy then chooses among those
// with room, with the cache and load of this moment, stand being where
// fr's tenant stands against its share. A request of a tenant over its
// share that must leave the last replica with nothing
// prefilling to another tenant (keepsClean) has no room, and one under
// its share goes first where nothing prefills (idleFirst). A
// disaggregated request's prefill side is chosen by its pairing and is
// not kept off.
func (p *Proxy) bindLate(o *outcome, fr *flowRequest, fo *FlowOptions, stand shareStand) bool {
	extra := p.flow.reservations(fr)
	full := p.saturated(fo, extra, stand)
	held := false // the request must not take the last replica with nothing prefilling
	if ix := p.router.Index(); ix != nil && (stand == shareOverGuard || stand == shareUnder) {
		view := ix.View(time.Now())
		switch {
		case stand == shareOverGuard:
			held = p.keepsClean(fr, &view, extra)
		case fr.rreq.Leg == "":
			if avoid, ok := p.idleFirst(fr, full, &view, extra); ok {
				o.avoid = avoid
				return true
			}
		}
	}
	crowded, _, ok := p.router.Room(nil, fr.rreq.Model, firstLeg(fr.rreq), full)
	if ok && fr.rreq.Leg == "" {
		// Also when held: a request the dispatcher let go goes on
		// whatever this returns, and is kept off the replicas where a
		// prompt is prefilling.
		o.avoid = crowded
	}
	return ok && !held
}

// limitText names a tenant limit and its value for an error message.
func limitText(limit string, fo *FlowOptions) string {
	l := fo.Limits
	switch limit {
	case flow.LimitRate:
		return strconv.FormatFloat(l.Rate, 'g', -1, 64) + " requests per second (flow.tenant_limits.rate)"
	case flow.LimitConcurrency:
		return strconv.Itoa(l.MaxConcurrent) + " requests in flight (flow.tenant_limits.max_concurrent)"
	case flow.LimitTokens:
		return strconv.Itoa(l.TokensPerMinute) + " prompt tokens per minute (flow.tenant_limits.tokens_per_minute)"
	}
	return limit
}

// failRetry is fail with a Retry-After of d, in whole seconds, at least 1.
func (p *Proxy) failRetry(ctx *fasthttp.RequestCtx, o *outcome, e *oai.Error, d time.Duration) {
	writeError(ctx, e)
	ctx.Response.Header.Set("Retry-After", strconv.Itoa(max(1, int(math.Ceil(d.Seconds())))))
	o.status, o.err = e.Status, e.Code
	p.finish(o)
}

// firstLeg is the leg a request is first served on: the prefill side in
// a disaggregated fleet, whose saturation holds it back.
func firstLeg(rreq *router.Request) backends.Role {
	if rreq.Leg == backends.RoleDecode {
		return backends.RolePrefill
	}
	return rreq.Leg
}

// saturated returns the test of a replica's saturation under fo: its
// metrics fresh and its engine's waiting requests (plus the growth of the
// requests in flight to it since the poll, plus extra[rep] dispatched in
// this round) at MaxWaiting, or its running and waiting requests (plus
// the change of those in flight) at MaxRunning, or one request dispatched
// to it this round while MaxRunning is set, unless the request's tenant
// holds less than its fair share (stand shareUnder), or, for a tenant at
// or over its share while others are active (shareOver), a prompt sent to
// it still prefilling (share.go), or
// its KV usage at MaxKV (or, by KV alone, one request dispatched to it in
// this round: KV usage shows it only at the next poll). A replica without
// fresh metrics is not saturated but by kvroute's own requests in flight
// to it at MaxRunning: saturation is measured, not guessed.
func (p *Proxy) saturated(fo *FlowOptions, extra map[*backends.Replica]int, stand shareStand) func(*backends.Replica) bool {
	now := time.Now()
	byRunning := fo.MaxRunning > 0 && stand != shareUnder
	kvOnly := fo.MaxWaiting == 0 && fo.MaxRunning == 0
	var view index.View // pending prefill, for a tenant over its share
	ix := p.router.Index()
	paced := fo.MaxRunning > 0 && stand >= shareOver && ix != nil
	if paced {
		view = ix.View(now)
	}
	return func(rep *backends.Replica) bool {
		if paced && view.Pending(rep) > 0 {
			return true
		}
		// kvroute's own requests to rep: in flight, and let go to it.
		own := rep.Load() + int64(extra[rep])
		s, fresh := rep.SnapshotAt(now)
		if !fresh || s == nil {
			return extra[rep] > 0 && kvOnly || byRunning && own >= int64(fo.MaxRunning)
		}
		if fo.MaxKV > 0 && (s.KVUsage >= fo.MaxKV || kvOnly && extra[rep] > 0) {
			return true
		}
		if byRunning {
			if extra[rep] > 0 {
				// One request a round: a batch takes new prompts as its
				// requests end, not many at once in one long prefill step.
				return true
			}
			// Requests that ended since the poll have left the batch. It
			// holds at least kvroute's own requests in flight: a poll
			// that found one of them ended at the engine but not yet at
			// kvroute would otherwise count the one sent after it twice
			// out (its replacement, when the batch had only it).
			batch := max(s.Running+s.Waiting+float64(own-s.InFlightAtScrape), float64(own))
			if batch >= float64(fo.MaxRunning) {
				return true
			}
		}
		if fo.MaxWaiting > 0 {
			// Requests in flight beyond those at the poll are taken to wait
			// (those that ended since have left the count).
			grown := float64(max(rep.Load()-s.InFlightAtScrape, 0)) + float64(extra[rep])
			return s.Waiting+grown >= float64(fo.MaxWaiting)
		}
		return false
	}
}

// FlowStats is what /debug/flow shows of flow control.
type FlowStats struct {
	// Queueing: saturation is measured, so requests may wait.
	Queueing bool            `json:"queueing"`
	Queue    flow.QueueStats `json:"queue"`
	// Tenants is the number of tenants whose limit state is kept.
	Tenants int `json:"tenants"`
	// Refused counts the requests flow control refused, by reason: a
	// tenant limit (rate, concurrency, tokens) or the queue (queue_full,
	// shed, queue_timeout).
	Refused map[string]int64 `json:"refused"`
}

// FlowStats returns flow control's state.
func (p *Proxy) FlowStats() FlowStats {
	f := p.flow
	f.mu.Lock()
	refused := maps.Clone(f.shed)
	f.mu.Unlock()
	return FlowStats{Queueing: p.live.Load().Flow.queues(), Queue: f.queue.Stats(), Tenants: f.limiter.Tenants(), Refused: refused}
}

// FlowQueued returns the requests waiting in the queue and their bytes.
func (p *Proxy) FlowQueued() (int, int64) { return p.flow.queue.Len() }

// SetFlowShare makes this instance enforce its share of the tenant limits
// as one of n instances of a cluster (flow.Limiter.SetShare).
func (p *Proxy) SetFlowShare(n int) { p.flow.limiter.SetShare(n) }

// wakeFlow tells the dispatcher capacity may have freed.
func (p *Proxy) wakeFlow() {
	select {
	case p.flow.wake <- struct{}{}:
	default:
	}
}

// flowTick is how often the dispatcher looks at the queue without being
// woken: a metrics poll may have shown room.
const flowTick = 25 * time.Millisecond

// ServeFlow dispatches the queue (see above) until ctx is done: whenever
// a request ends, and every flowTick.
func (p *Proxy) ServeFlow(ctx context.Context) {
	t := time.NewTicker(flowTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.flow.sweep()
		case <-p.flow.wake:
		}
		p.dispatchFlow()
	}
}

// dispatchFlow dispatches the queued requests for which some replica has
// room, counting each dispatched one against the replica that had it
// until the next round.
func (p *Proxy) dispatchFlow() {
	fo := &p.live.Load().Flow
	if n, _ := p.flow.queue.Len(); n == 0 {
		return
	}
	extra := p.flow.reservations(nil) // and those let go in this round
	if extra == nil {
		extra = map[*backends.Replica]int{}
	}
	over := p.saturated(fo, extra, shareOver)
	tests := [...]func(*backends.Replica) bool{shareAlone: p.saturated(fo, extra, shareAlone),
		shareUnder: p.saturated(fo, extra, shareUnder), shareOver: over, shareOverGuard: over}
	var view index.View // prompts prefilling, for keepsClean
	if ix := p.router.Index(); ix != nil {
		view = ix.View(time.Now())
	}
	replicas := map[string]int{}    // candidates by model and leg, for the shares
	var crowded []*backends.Replica // reused by every question
	f := p.flow
	loc := p.newLocality(fo)
	f.queue.DispatchAhead(localityAhead, func(it *flow.Item) bool {
		fr := it.Value.(*flowRequest)
		if !fo.queues() {
			f.shareHold(fr)
			return true // saturation no longer measured (a reload): all go
		}
		test := tests[shareAlone]
		if fo.MaxRunning > 0 {
			k := string(firstLeg(fr.rreq)) + " " + fr.rreq.Model
			n, ok := replicas[k]
			if !ok {
				n = p.candidateCount(fr)
				replicas[k] = n
			}
			stand := f.standOf(fr.tenant, fo.MaxRunning, n)
			if stand == shareOverGuard && p.router.Index() != nil && p.keepsClean(fr, &view, extra) {
				return false
			}
			test = tests[stand]
		}
		var rep *backends.Replica
		var ok bool
		crowded, rep, ok = p.router.Room(crowded[:0], fr.rreq.Model, firstLeg(fr.rreq), test)
		if ok && loc.waitsForHolder(fr, crowded) {
			return false
		}
		if rep != nil {
			extra[rep]++
		}
		if ok {
			f.shareHold(fr)
			if rep != nil {
				f.reserve(fr, rep)
			}
		}
		return ok
	})
}
