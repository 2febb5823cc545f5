package sim

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxClockLag bounds how far the engine's virtual clock may fall behind real
// time (CPU starvation) before it is reset instead of caught up.
const maxClockLag = 20 * time.Millisecond

type reqState int

const (
	stateWaiting reqState = iota
	stateRunning
	stateDone
	stateAborted
)

// request is one generation request inside the engine. Fields below the
// marker are guarded by Replica.mu.
type request struct {
	promptTokens int
	keys         []uint64 // chained keys of the prompt's whole blocks
	prompt       []byte   // the prompt's bytes, kept only with KV events
	tail         []byte   // the prompt's bytes after its whole blocks
	chat         bool     // a chat request (its answer renders as a message)
	maxTokens    int
	target       int // tokens to generate before stopping
	seed         uint64
	notify       chan struct{}
	// remote: the prompt's KV comes from a prefill replica (disaggregated
	// decode): what the replica does not hold costs TransferTokenMs a
	// token instead of being computed, and counts as transferred, not as
	// queried or hit.
	remote bool

	// guarded by Replica.mu
	state      reqState
	epoch      int // bumped on preemption; stale plan entries are skipped
	generated  int
	computed   int        // tokens whose KV is computed (incl. hits)
	blocks     []*kvBlock // block i holds tokens [i*bs, (i+1)*bs)
	registered int        // prompt blocks registered in the cache
	cached     int        // hit tokens (GPU + host) at first admission, -1 before
}

// ctxLen is the number of tokens the request's KV must cover before it can
// sample its next token.
func (q *request) ctxLen() int { return q.promptTokens + q.generated }

// maxHit is how many of q's leading blocks (of bs tokens) admission may
// find cached: its whole blocks, short of its last token, which is always
// computed.
func (q *request) maxHit(bs int) int { return max(min(len(q.keys), (q.ctxLen()-1)/bs), 0) }

// signal wakes the request's handler without blocking.
func (q *request) signal() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

// planEntry is the work of one request in one step.
type planEntry struct {
	q       *request
	epoch   int
	n       int
	prefill bool
}

// counters are cumulative engine counters (guarded by Replica.mu).
type counters struct {
	requests, finished, aborted, rejected, preemptions int64
	finishedStop, finishedLength                       int64
	promptTokens, queryTokens, hitTokens               int64
	hostQueryTokens, hostHitTokens                     int64
	prefillTokens, generatedTokens, steps              int64
	busy                                               time.Duration
	pinnedBlockMS                                      float64
	arrivalHeld, arrivalBest                           int64
	remoteRequests, transferTokens                     int64
}

// Replica is one simulated vLLM server: an engine goroutine and its HTTP
// handler. Create it with NewReplica; stop its engine with Close.
type Replica struct {
	cfg       Config
	watermark int

	mu      sync.Mutex
	cache   *kvCache
	host    *hostTier // nil without a host tier
	fleet   *arrivals // the fleet's caches as requests arrive; nil alone
	running []*request
	waiting []*request
	plan    []planEntry
	c       counters
	// scratch buffers of registerAnswer
	transcript []byte
	answerKeys []uint64

	// With Config.KVEvents: the events logged since the last batch, the
	// goroutine publishing them, and a scratch buffer of registerBlocks
	// and writeThrough. All nil otherwise.
	events   *eventLog
	evStream *eventStream
	fresh    []bool

	kick      chan struct{}
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	ids       atomic.Uint64
	renderIDs atomic.Uint64
	handler   http.Handler
}

// NewReplica builds a replica from cfg (zero fields take the preset's
// values) and starts its engine goroutine.
func NewReplica(cfg Config) (*Replica, error) { return newReplica(cfg, newZMQSink) }

// newReplica is NewReplica with the event sink made by newSink when
// cfg.KVEvents is on.
func newReplica(cfg Config, newSink func(*Config) (batchSink, error)) (*Replica, error) {
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	r := &Replica{
		cfg:       c,
		watermark: int(c.WatermarkFrac * float64(c.NumGPUBlocks)),
		cache:     newKVCache(c.NumGPUBlocks),
		host:      newHostTier(c.HostBlocks),
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
	r.handler = r.newMux()
	if c.KVEvents {
		sink, err := newSink(&c)
		if err != nil {
			return nil, err
		}
		r.events = &eventLog{bb: c.BlockSize * BytesPerToken}
		r.cache.log = r.events
		if r.host != nil {
			r.host.log = r.events
		}
		r.evStream = newEventStream(sink)
		go r.evStream.run(r)
	}
	go r.loop()
	return r, nil
}

// Config returns the replica's resolved configuration.
func (r *Replica) Config() Config { return r.cfg }

// Close stops the engine goroutine and, with Config.KVEvents, publishes the
// last events and closes the event sockets. Requests still in flight never
// finish; close the HTTP server first (Serve does on context end).
func (r *Replica) Close() {
	r.closeOnce.Do(func() {
		close(r.stop)
		<-r.done
		if r.evStream != nil {
			r.evStream.close()
		}
	})
	<-r.done
}

// Serve serves the replica's Handler on ln until ctx is done, then closes
// the server and every open connection (aborting their requests). It
// returns nil after ctx ends, or the error that stopped serving. It does not
// stop the engine; call Close for that.
func (r *Replica) Serve(ctx context.Context, ln net.Listener) error {
	return serve(ctx, ln, r.handler)
}

// serve is Replica.Serve of handler h.
func serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-stopped:
		}
	}()
	err := srv.Serve(ln)
	close(stopped)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (r *Replica) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// submit queues a request.
func (r *Replica) submit(q *request) {
	var held, best int
	if r.fleet != nil {
		held, best = r.fleet.observe(r, q)
	}
	r.mu.Lock()
	q.state = stateWaiting
	q.cached = -1
	r.waiting = append(r.waiting, q)
	r.c.requests++
	r.c.promptTokens += int64(q.promptTokens)
	r.c.arrivalHeld += int64(held)
	r.c.arrivalBest += int64(best)
	r.mu.Unlock()
	r.wake()
}

// abort removes a request that has not finished, unpinning its blocks.
func (r *Replica) abort(q *request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch q.state {
	case stateWaiting:
		r.waiting = removeReq(r.waiting, q)
	case stateRunning:
		r.running = removeReq(r.running, q)
		r.releaseBlocks(q)
	default:
		return
	}
	q.state = stateAborted
	r.c.aborted++
	r.wake()
}

func removeReq(list []*request, q *request) []*request {
	for i, x := range list {
		if x == q {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// releaseBlocks unpins a request's blocks, last block first, so that the
// tail of a prefix is evicted before its head.
func (r *Replica) releaseBlocks(q *request) {
	for i := len(q.blocks) - 1; i >= 0; i-- {
		r.cache.release(q.blocks[i])
		q.blocks[i] = nil
	}
	q.blocks = q.blocks[:0]
}

// loop is the engine: plan a step, sleep its scaled duration, apply it.
func (r *Replica) loop() {
	defer close(r.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var clock time.Time // real time at which the last step ended
	idle := true
	for {
		r.mu.Lock()
		ms := r.schedule()
		pinned := r.cache.pinned // held through the step
		r.mu.Unlock()
		if ms == 0 {
			idle = true
			select {
			case <-r.kick:
				continue
			case <-r.stop:
				return
			}
		}
		now := time.Now()
		if idle || now.Sub(clock) > maxClockLag {
			clock = now
		}
		idle = false
		clock = clock.Add(time.Duration(ms * r.cfg.TimeScale * float64(time.Millisecond)))
		if d := time.Until(clock); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-r.stop:
				timer.Stop()
				return
			}
		}
		r.mu.Lock()
		r.c.steps++
		r.c.busy += msDur(ms)
		r.c.pinnedBlockMS += float64(pinned) * ms
		r.apply()
		if r.events != nil && len(r.events.pending) > 0 {
			r.evStream.wake()
		}
		r.mu.Unlock()
	}
}

// schedule plans the next step into r.plan and returns its simulated cost in
// ms (0 when there is nothing to do). Decodes go first (1 token of budget
// each), then partially prefilled running requests, then admissions from the
// waiting queue in FIFO order, all chunked to the remaining budget.
func (r *Replica) schedule() float64 {
	cfg := &r.cfg
	bs := cfg.BlockSize
	r.plan = r.plan[:0]
	budget := cfg.MaxBatchedTokens
	ms := 0.0
	preempts := r.c.preemptions

	// Pass 1: requests needing one token (decodes).
	for i := 0; i < len(r.running) && budget > 0; i++ {
		q := r.running[i]
		if q.ctxLen()-q.computed != 1 {
			continue
		}
		// Victims come from the tail (indices > i, not planned yet) or
		// are q itself, the last running request.
		if !r.ensureBlocks(q, q.computed+1) {
			break
		}
		pre := q.generated == 0
		r.plan = append(r.plan, planEntry{q: q, epoch: q.epoch, n: 1, prefill: pre})
		budget--
		if pre {
			ms += cfg.chunkMs(q, 1)
		} else {
			ms += cfg.DecodeSeqMs + cfg.DecodeCtxMs*float64(q.ctxLen())
		}
	}

	// Pass 2: running requests still prefilling (their blocks were
	// reserved at admission).
	for _, q := range r.running {
		if budget == 0 {
			break
		}
		need := q.ctxLen() - q.computed
		if need <= 1 {
			continue
		}
		n := min(need, budget)
		if !r.ensureBlocks(q, q.computed+n) {
			break // cannot happen: prefill blocks are reserved at admission
		}
		r.plan = append(r.plan, planEntry{q: q, epoch: q.epoch, n: n, prefill: true})
		budget -= n
		ms += cfg.chunkMs(q, n)
	}

	// Pass 3: admissions, FIFO, head-of-line blocking on KV space; none in
	// a step that had to preempt (as vLLM). The GPU hits are the leading
	// run of cached blocks; the host hits continue that run in the host
	// tier. Both stop short of the last prompt token. Host-hit blocks get
	// fresh GPU blocks like computed ones and are loaded in this step.
	for r.c.preemptions == preempts && budget > 0 && len(r.waiting) > 0 && len(r.running) < cfg.MaxNumSeqs {
		q := r.waiting[0]
		T := q.ctxLen()
		maxHit := q.maxHit(bs)
		hits := r.cache.lookup(q.keys, maxHit)
		hostHit := 0
		if r.host != nil {
			hostHit = r.host.run(q.keys[len(hits):maxHit])
		}
		needBlocks := (T+bs-1)/bs - len(hits)
		avail := r.cache.available() - unpinnedCount(hits)
		if len(r.running) > 0 {
			avail -= r.watermark
		}
		if needBlocks > avail {
			break
		}
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		for _, b := range hits {
			r.cache.pin(b)
		}
		q.blocks = append(q.blocks[:0], hits...)
		for k := 0; k < needBlocks; k++ {
			q.blocks = append(q.blocks, r.cache.alloc())
		}
		hitTok, hostTok := len(hits)*bs, hostHit*bs
		// The loaded host-hit blocks count as computed; apply registers
		// them in the GPU cache with the first chunk.
		q.registered = len(hits)
		q.computed = hitTok + hostTok
		if q.cached < 0 {
			q.cached = hitTok + hostTok
		}
		if q.remote {
			r.c.remoteRequests++
			r.c.transferTokens += int64(T - hitTok - hostTok)
		} else {
			r.c.queryTokens += int64(T)
			r.c.hitTokens += int64(hitTok)
		}
		if r.host != nil && !q.remote {
			// Refresh the hits, last first, so the head of the prefix
			// ends up most recently used.
			for i := len(hits) + hostHit - 1; i >= len(hits); i-- {
				r.host.touch(q.keys[i])
			}
			r.c.hostQueryTokens += int64(T - hitTok)
			r.c.hostHitTokens += int64(hostTok)
		}
		q.state = stateRunning
		r.running = append(r.running, q)

		n := min(T-q.computed, budget)
		r.plan = append(r.plan, planEntry{q: q, epoch: q.epoch, n: n, prefill: true})
		budget -= n
		ms += cfg.chunkMs(q, n) + cfg.cachedMs(hitTok) + cfg.hostLoadMs(hostTok)
	}

	if len(r.plan) == 0 {
		return 0
	}
	ms += cfg.StepBaseMs
	if ms <= 0 {
		ms = 1e-6 // never report an empty step for a non-empty plan
	}
	return ms
}

// ensureBlocks makes q hold blocks for its first tokens tokens, preempting
// running requests from the tail (most recently admitted first) while space
// is short. It reports false if q itself had to be preempted.
func (r *Replica) ensureBlocks(q *request, tokens int) bool {
	bs := r.cfg.BlockSize
	need := (tokens+bs-1)/bs - len(q.blocks)
	for need > r.cache.available() {
		victim := r.running[len(r.running)-1]
		r.preempt(victim)
		if victim == q {
			return false
		}
	}
	for ; need > 0; need-- {
		q.blocks = append(q.blocks, r.cache.alloc())
	}
	return true
}

// preempt moves a running request back to the head of the waiting queue,
// dropping its KV (its registered prompt blocks stay cached, so the
// recompute will mostly hit).
func (r *Replica) preempt(q *request) {
	r.running = removeReq(r.running, q)
	r.releaseBlocks(q)
	q.computed = 0
	q.registered = 0
	q.epoch++
	q.state = stateWaiting
	r.waiting = append(r.waiting, nil)
	copy(r.waiting[1:], r.waiting)
	r.waiting[0] = q
	r.c.preemptions++
}

// apply advances every request of the planned step: KV computed, full
// prompt blocks registered (and written through to the host tier), tokens
// sampled, finished requests released.
func (r *Replica) apply() {
	bs := r.cfg.BlockSize
	finished := false
	for i := range r.plan {
		e := &r.plan[i]
		q := e.q
		e.q = nil
		if q.state != stateRunning || q.epoch != e.epoch {
			continue
		}
		q.computed += e.n
		if e.prefill && !q.remote {
			r.c.prefillTokens += int64(e.n)
		}
		if first, to := q.registered, min(len(q.keys), q.computed/bs); to > first {
			parent, hasParent := keyRoot, first > 0
			if hasParent {
				parent = q.keys[first-1]
			}
			var data []byte
			if q.prompt != nil {
				data = q.prompt[first*bs*BytesPerToken : to*bs*BytesPerToken]
			}
			r.registerBlocks(q.blocks[first:to], q.keys[first:to], data, parent, hasParent)
			q.registered = to
		}
		if q.computed < q.ctxLen() {
			continue
		}
		q.generated++
		r.c.generatedTokens++
		if q.generated >= q.target {
			q.state = stateDone
			r.registerAnswer(q)
			r.releaseBlocks(q)
			r.c.finished++
			if q.target < q.maxTokens {
				r.c.finishedStop++
			} else {
				r.c.finishedLength++
			}
			finished = true
		}
		q.signal()
	}
	r.plan = r.plan[:0]
	if finished {
		kept := r.running[:0]
		for _, q := range r.running {
			if q.state == stateRunning {
				kept = append(kept, q)
			}
		}
		for i := len(kept); i < len(r.running); i++ {
			r.running[i] = nil
		}
		r.running = kept
	}
}

// registerAnswer gives the blocks of a finished request's answer their keys,
// as vLLM caches the full blocks of generated tokens. The request's
// transcript (its prompt followed by the answer as the next turn renders it,
// see appendTranscript) continues the prompt's chain of block keys; each
// whole block of it past the prompt's registers the request's block at the
// same index, so a client that sends the answer back in its next turn hits
// every whole block of prompt and answer. The chat transcript is a few
// bytes longer than the KV the engine computed (the role marker and the
// newline are counted as neither prompt nor output tokens): its whole
// blocks are registered only as far as the request holds blocks, which,
// for BlockSize over 4, covers all of them (the request holds
// promptTokens+generated-1 computed tokens, and the transcript is less than
// 5 tokens longer). No block is allocated here, so capacity and step times
// are unchanged; the blocks go on the LRU list in release order (the tail
// first). With a host tier, the answer's keys are written through like
// prompt blocks, last first.
func (r *Replica) registerAnswer(q *request) {
	room := len(q.blocks) - len(q.keys)
	if room <= 0 || q.registered < len(q.keys) {
		return
	}
	parent := keyRoot
	if len(q.keys) > 0 {
		parent = q.keys[len(q.keys)-1]
	}
	r.transcript = appendTranscript(append(r.transcript[:0], q.tail...), q.chat, q.seed, q.generated)
	keys := chainKeys(r.answerKeys[:0], parent, r.transcript, r.cfg.BlockSize*BytesPerToken)
	r.answerKeys = keys
	keys = keys[:min(len(keys), room)]
	if len(keys) > 0 {
		r.registerBlocks(q.blocks[len(q.keys):len(q.keys)+len(keys)], keys,
			r.transcript[:len(keys)*r.cfg.BlockSize*BytesPerToken], parent, len(q.keys) > 0)
	}
}

// registerBlocks registers blocks[i] under keys[i], keys[0] chained to
// parent (none when hasParent is false, at the start of a prompt), and
// writes the keys through to the host tier. With KV events, data holds the
// blocks' bytes and every run of blocks newly stored is logged as one
// BlockStored (a block that already had its key, or whose key another
// block holds, breaks a run).
func (r *Replica) registerBlocks(blocks []*kvBlock, keys []uint64, data []byte, parent uint64, hasParent bool) {
	fresh := r.fresh[:0]
	for i, k := range keys {
		stored := r.cache.register(blocks[i], k)
		if r.events != nil {
			fresh = append(fresh, stored)
		}
	}
	if r.events != nil {
		r.events.storedRuns(mediumGPU, keys, data, parent, hasParent, fresh)
		r.fresh = fresh
	}
	if r.host != nil {
		r.writeThrough(keys, data, parent, hasParent)
	}
}

// writeThrough stores keys in the host tier, last first so that the head
// of the prefix ends up most recently used. A block left anonymous on GPU
// as a duplicate is stored too: its key is hittable on GPU. With KV events
// the runs of keys newly held are logged as BlockStored of medium CPU (a
// key the tier already held is only refreshed; one evicted again within
// the same write-through was never announced, its eviction is logged).
func (r *Replica) writeThrough(keys []uint64, data []byte, parent uint64, hasParent bool) {
	fresh := r.fresh[:0]
	if r.events != nil {
		for _, k := range keys {
			fresh = append(fresh, !r.host.contains(k))
		}
	}
	for j := len(keys) - 1; j >= 0; j-- {
		r.host.store(keys[j])
	}
	if r.events != nil {
		for j, k := range keys {
			fresh[j] = fresh[j] && r.host.contains(k)
		}
		r.events.storedRuns(mediumCPU, keys, data, parent, hasParent, fresh)
		r.fresh = fresh
	}
}

// Stats is a snapshot of a replica's counters and state.
type Stats struct {
	Name string
	// Requests accepted into the engine, finished (stop or length),
	// aborted (client gone) and rejected (HTTP 4xx before the engine).
	Requests, Finished, Aborted, Rejected int64
	// Preemptions counts recompute preemptions.
	Preemptions int64
	// PromptTokens sums the prompt tokens of accepted requests.
	PromptTokens int64
	// QueryTokens and HitTokens are the GPU prefix-cache counters (vLLM
	// prefix_cache_queries/hits, counted at every admission): the prompt
	// tokens looked up and those found in the GPU cache. HitTokens excludes
	// host-tier hits; ReuseHitTokens and ReuseHitRate include them.
	QueryTokens, HitTokens int64
	// HostQueryTokens and HostHitTokens are the host-tier counters (vLLM
	// external_prefix_cache_queries/hits), counted at every admission when
	// the replica has a host tier, else zero: the prompt tokens not hit on
	// GPU, and those of them loaded from the host tier.
	HostQueryTokens, HostHitTokens int64
	// PrefillTokens counts tokens actually computed in prefill (misses,
	// including recomputation after preemption).
	PrefillTokens int64
	// GeneratedTokens counts sampled output tokens.
	GeneratedTokens int64
	// Steps and BusyTime (unscaled simulated time) of non-empty steps.
	Steps    int64
	BusyTime time.Duration
	// PinnedBlockMS is the blocks running requests pinned, summed over
	// the steps times each step's simulated milliseconds: over a span of
	// T simulated ms, PinnedBlockMS / (NumBlocks × T) is the time-weighted
	// share of the GPU cache that running requests held, which no prefix
	// of another request could be cached in.
	PinnedBlockMS float64
	// ArrivalHeldTokens and ArrivalBestTokens sum, over the requests
	// accepted, the prompt tokens this replica held of each when it
	// arrived (counted as admission counts hits, both tiers) and the most
	// any replica of its fleet held then: their ratio is how much of what
	// the fleet's caches offered the requests sent here found. Both are 0
	// for a replica not started by StartFleet.
	ArrivalHeldTokens, ArrivalBestTokens int64
	// RemoteRequests counts the requests whose prompt's KV came from a
	// prefill replica (disaggregated decode, see Config.Role), and
	// TransferTokens the prompt tokens of theirs received rather than
	// found in this replica's cache; neither counts in QueryTokens or
	// HitTokens.
	RemoteRequests, TransferTokens int64
	// Current state.
	Running, Waiting                      int
	KVUsage                               float64
	PinnedBlocks, CachedBlocks, NumBlocks int
	// HostBlocks is the host tier's capacity and HostCachedBlocks the
	// number of keys it holds (both 0 without a host tier).
	HostBlocks, HostCachedBlocks int
	// KVEventBatches counts the KV event batches published (withheld ones
	// of a cut stream included), KVEventErrors those the publisher failed
	// to take (both 0 without Config.KVEvents).
	KVEventBatches, KVEventErrors int64
}

// HitRate is the GPU prefix-cache hit rate HitTokens / QueryTokens (0 when
// nothing was queried).
func (s Stats) HitRate() float64 {
	if s.QueryTokens == 0 {
		return 0
	}
	return float64(s.HitTokens) / float64(s.QueryTokens)
}

// ReuseHitTokens is the number of prompt tokens served by prefix reuse from
// either tier: HitTokens (GPU) + HostHitTokens (host tier), counted at
// every admission (without preemptions, the sum of the responses'
// usage.prompt_tokens_details.cached_tokens).
func (s Stats) ReuseHitTokens() int64 { return s.HitTokens + s.HostHitTokens }

// ReuseHitRate is ReuseHitTokens / QueryTokens, the share of queried prompt
// tokens not prefilled thanks to either tier (0 when nothing was queried).
// It equals HitRate without a host tier.
func (s Stats) ReuseHitRate() float64 {
	if s.QueryTokens == 0 {
		return 0
	}
	return float64(s.ReuseHitTokens()) / float64(s.QueryTokens)
}

// Stats returns a snapshot of the replica's counters.
func (r *Replica) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Stats{
		Name:              r.cfg.Name,
		Requests:          r.c.requests,
		Finished:          r.c.finished,
		Aborted:           r.c.aborted,
		Rejected:          r.c.rejected,
		Preemptions:       r.c.preemptions,
		PromptTokens:      r.c.promptTokens,
		QueryTokens:       r.c.queryTokens,
		HitTokens:         r.c.hitTokens,
		HostQueryTokens:   r.c.hostQueryTokens,
		HostHitTokens:     r.c.hostHitTokens,
		PrefillTokens:     r.c.prefillTokens,
		GeneratedTokens:   r.c.generatedTokens,
		Steps:             r.c.steps,
		BusyTime:          r.c.busy,
		PinnedBlockMS:     r.c.pinnedBlockMS,
		ArrivalHeldTokens: r.c.arrivalHeld,
		ArrivalBestTokens: r.c.arrivalBest,
		RemoteRequests:    r.c.remoteRequests,
		TransferTokens:    r.c.transferTokens,
		Running:           len(r.running),
		Waiting:           len(r.waiting),
		KVUsage:           r.cache.usage(),
		PinnedBlocks:      r.cache.pinned,
		CachedBlocks:      r.cache.lruLen,
		NumBlocks:         r.cache.total,
	}
	if r.host != nil {
		st.HostBlocks = r.host.cap
		st.HostCachedBlocks = r.host.len()
	}
	if r.evStream != nil {
		st.KVEventBatches = r.evStream.batches.Load()
		st.KVEventErrors = r.evStream.errs.Load()
	}
	return st
}
