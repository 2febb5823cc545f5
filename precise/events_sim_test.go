package precise

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/tokenize"
)

// evSim is a simulated replica publishing KV events, followed by Events
// into an Index as the backend be, and by an oracle subscriber of its own.
type evSim struct {
	t      *testing.T
	rep    *sim.Replica
	url    string
	be     *backends.Replica
	ix     *index.Index
	ev     *Events
	oracle *evOracle
	// seqBase is the replica's batch count when its sequence last started
	// at 0.
	seqBase int64
}

// startEvSim starts a replica of gpuBlocks blocks of 16 tokens (and
// hostBlocks in a host tier) with events in encoding enc, and follows it,
// with the EventsOptions opts change.
func startEvSim(t *testing.T, enc string, gpuBlocks, hostBlocks int, opts ...func(*EventsOptions)) *evSim {
	t.Helper()
	f, err := sim.StartFleet(t.Context(), 1, 0, sim.Config{
		Preset: "llama-8b-h100", Model: evTestModel, NumGPUBlocks: gpuBlocks, HostBlocks: hostBlocks, BlockSize: evTestBlock,
		StepBaseMs: 1, DecodeSeqMs: -1, DecodeCtxMs: -1, PrefillTokenMs: 0.0001, PrefillCtxMs: -1, PrefillAttnMs: -1,
		CachedTokenFrac: -1, WatermarkFrac: -1,
		KVEvents: true, KVEventsEncoding: enc, KVEventsTopic: "kv",
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	s := &evSim{t: t, rep: f.Replicas[0], url: f.URLs[0], be: evTestFleet(t, 1)[0], ix: evTestIndex()}
	o := EventsOptions{Index: s.ix, BlockSize: evTestBlock, ReplayTimeout: 5 * time.Second}
	for _, f := range opts {
		f(&o)
	}
	s.ev, err = NewEvents(o)
	if err != nil {
		t.Fatal(err)
	}
	ep := s.rep.KVEventsEndpoints()
	if err := s.ev.Follow(t.Context(), s.be, Endpoint{Endpoint: ep.Endpoint, ReplayEndpoint: ep.ReplayEndpoint, Topic: ep.Topic}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ev.Stop(s.be) })
	s.oracle = newEvOracle(t, ep)
	// A subscription receives only once it is through; its first batch
	// replays what came before.
	for i := 0; s.ev.Status(s.be).Batches == 0 || s.oracle.sub.Status().Batches == 0; i++ {
		if i == 200 {
			t.Fatalf("nothing delivered: %+v", s.ev.Status(s.be))
		}
		s.complete(evPrompt(fmt.Sprint("join", i), 2))
		time.Sleep(10 * time.Millisecond)
	}
	if !s.ev.Live(s.be) {
		t.Fatalf("not live after a batch: %+v", s.ev.Status(s.be))
	}
	return s
}

// evPrompt is a prompt of blocks whole blocks of 16 tokens of 4 bytes.
func evPrompt(seed string, blocks int) string {
	var b strings.Builder
	for i := 0; b.Len() < blocks*evTestBlock*sim.BytesPerToken; i++ {
		fmt.Fprintf(&b, "%s-%d ", seed, i)
	}
	return b.String()[:blocks*evTestBlock*sim.BytesPerToken]
}

var evClient = &http.Client{Timeout: 20 * time.Second}

// complete sends a completion of prompt to the replica.
func (s *evSim) complete(prompt string) {
	s.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": evTestModel, "prompt": prompt, "max_tokens": 2})
	req, err := http.NewRequestWithContext(s.t.Context(), http.MethodPost, s.url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := evClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
}

// promptHeld is how many tokens of prompt's exact key the Index says the
// replica holds.
func (s *evSim) promptHeld(prompt string) int {
	return evHeld(s.ix, tokenize.AppendExactKey(nil, evTestModel, sim.TokenIDs([]byte(prompt)), evTestBlock), s.be)
}

// converged reports whether both subscriptions applied every batch the
// replica published, no request holds blocks, and the Index holds, for the
// replica, exactly the blocks its events say the engine holds and can hit
// (those whose every ancestor it holds too), the events saying it holds
// its cached blocks (in either tier, with a host tier).
func (s *evSim) converged() bool {
	st := s.rep.Stats()
	last := st.KVEventBatches - s.seqBase - 1
	if st.PinnedBlocks != 0 || s.ev.Status(s.be).Seq != last || s.oracle.sub.Status().Seq != last {
		return false
	}
	keys, held := s.oracle.hittable()
	if st.HostBlocks == 0 && held != st.CachedBlocks ||
		held < max(st.CachedBlocks, st.HostCachedBlocks) || held > st.CachedBlocks+st.HostCachedBlocks {
		return false
	}
	for _, k := range keys {
		if evHeld(s.ix, k, s.be) != len(k)*evTestBlock {
			return false
		}
	}
	return evHeldAll(s.ix, s.be) == int64(len(keys)*evTestBlock)
}

// serveConverged serves n prompts of blocks blocks each, named from seed,
// waits until converged and returns the prompts.
func (s *evSim) serveConverged(seed string, n, blocks int) []string {
	s.t.Helper()
	prompts := make([]string, n)
	for i := range prompts {
		prompts[i] = evPrompt(fmt.Sprint(seed, i), blocks)
		s.complete(prompts[i])
	}
	s.waitConverged()
	return prompts
}

// waitConverged waits until converged, failing after 10 s.
func (s *evSim) waitConverged() {
	s.t.Helper()
	wait.For(s.t, 10*time.Second, "the Index to hold the engine's blocks", s.converged)
}

// evOracle plays a replica's events, as its own subscription delivers
// them, into the plainest model of the engine's cache: each held block's
// parent and tokens.
type evOracle struct {
	sub    *kvevents.Subscriber
	mu     sync.Mutex
	blocks map[uint64]*evOracleBlock
}

type evOracleBlock struct {
	parent    uint64
	hasParent bool
	toks      []uint32
	refs      int
}

func newEvOracle(t *testing.T, ep sim.KVEventsEndpoint) *evOracle {
	t.Helper()
	o := &evOracle{blocks: make(map[uint64]*evOracleBlock)}
	sub, err := kvevents.Subscribe(t.Context(), kvevents.SubOptions{Endpoint: ep.Endpoint, ReplayEndpoint: ep.ReplayEndpoint, Topic: ep.Topic, Handler: o})
	if err != nil {
		t.Fatal(err)
	}
	o.sub = sub
	return o
}

func (o *evOracle) Apply(b kvevents.Batch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case kvevents.BlockStored:
			parent, has := ev.ParentHash, ev.HasParent
			for i, h := range ev.BlockHashes {
				if o.blocks[h] == nil {
					o.blocks[h] = &evOracleBlock{parent: parent, hasParent: has, toks: ev.TokenIDs[i*ev.BlockSize : (i+1)*ev.BlockSize]}
				}
				o.blocks[h].refs++
				parent, has = h, true
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if b := o.blocks[h]; b != nil {
					if b.refs--; b.refs == 0 {
						delete(o.blocks, h)
					}
				}
			}
		case kvevents.AllBlocksCleared:
			clear(o.blocks)
		}
	}
}

func (o *evOracle) Reset(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	clear(o.blocks)
}

// hittable returns the exact key of every held block whose ancestors are
// all held, and the number of blocks held.
func (o *evOracle) hittable() (keys [][]uint32, held int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.blocks {
		var chain [][]uint32
		ok := true
		for c := b; ; {
			chain = append(chain, c.toks)
			if !c.hasParent {
				break
			}
			if c = o.blocks[c.parent]; c == nil {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		var toks []uint32
		for i := len(chain) - 1; i >= 0; i-- {
			toks = append(toks, chain[i]...)
		}
		keys = append(keys, tokenize.AppendExactKey(nil, evTestModel, toks, evTestBlock))
	}
	return keys, len(o.blocks)
}

// TestEventsFollowSim: in either encoding, the prompts a simulated replica
// served are in the Index under their exact keys, and the Index holds what
// the engine's events say it holds; a prefix-cache reset takes it all out,
// and so does Stop.
func TestEventsFollowSim(t *testing.T) {
	for _, enc := range []string{"positional", "tagged"} {
		t.Run(enc, func(t *testing.T) {
			s := startEvSim(t, enc, 1000, 0)
			a := evPrompt("a", 20)
			prompts := []string{a, evPrompt("b", 12), a[:10*evTestBlock*sim.BytesPerToken] + evPrompt("c", 6)}
			for _, p := range prompts {
				s.complete(p)
			}
			s.waitConverged()
			for i, p := range prompts {
				if got, want := s.promptHeld(p), len(p)/sim.BytesPerToken; got != want {
					t.Fatalf("prompt %d: %d tokens held, want %d", i, got, want)
				}
			}
			st := s.ev.Status(s.be)
			if !st.Live || !st.Connected || st.Stored == 0 || st.Blocks != s.rep.Stats().CachedBlocks || st.Skipped+st.Unplaceable != 0 {
				t.Fatalf("status %+v", st)
			}
			if !s.rep.ResetPrefixCache() {
				t.Fatal("reset refused")
			}
			wait.For(t, 10*time.Second, "the clear", func() bool { return s.ev.Status(s.be).Clears > 0 })
			if n := evHeldAll(s.ix, s.be); n != 0 || s.ev.Status(s.be).Blocks != 0 || !s.ev.Status(s.be).Complete {
				t.Fatalf("after the reset the replica holds %d tokens", n)
			}
			s.complete(prompts[1])
			wait.For(t, 10*time.Second, "the prompt stored again", func() bool { return s.promptHeld(prompts[1]) == len(prompts[1])/sim.BytesPerToken })
			s.ev.Stop(s.be)
			if st := s.ev.Status(s.be); st.Followed || s.ev.Live(s.be) || evHeldAll(s.ix, s.be) != 0 {
				t.Fatalf("after Stop: %+v, %d tokens held", st, evHeldAll(s.ix, s.be))
			}
		})
	}
}

// TestEventsFollowSimEvictions: through the evictions of a small cache the
// Index keeps holding what the engine holds.
func TestEventsFollowSimEvictions(t *testing.T) {
	s := startEvSim(t, "positional", 40, 0)
	prompts := s.serveConverged("evict", 6, 12)
	if st := s.ev.Status(s.be); st.Removed == 0 {
		t.Fatalf("no removal applied: %+v", st)
	}
	if got := s.promptHeld(prompts[0]); got != 0 {
		t.Fatalf("the first prompt, evicted since, still holds %d tokens", got)
	}
}

// TestEventsFollowSimHostTier: blocks the GPU cache evicted and the host
// tier keeps stay in the Index (the engine loads them back); blocks gone
// from both tiers leave it.
func TestEventsFollowSimHostTier(t *testing.T) {
	s := startEvSim(t, "tagged", 40, 60)
	prompts := s.serveConverged("tier", 8, 12)
	st, rs := s.ev.Status(s.be), s.rep.Stats()
	if st.Removed == 0 || rs.HostCachedBlocks == 0 {
		t.Fatalf("status %+v, replica %+v", st, rs)
	}
	if got := s.promptHeld(prompts[0]); got != 0 {
		t.Fatalf("the first prompt, gone from both tiers, holds %d tokens", got)
	}
	if st.Blocks <= rs.CachedBlocks {
		t.Fatalf("%d blocks kept, no more than the %d the GPU holds", st.Blocks, rs.CachedBlocks)
	}
}

// TestEventsFollowSimCut: a stream cut and restored shows a gap that the
// replay fills: the Index ends equal to the engine's blocks, with the
// prompts served during the cut, and no reset.
func TestEventsFollowSimCut(t *testing.T) {
	s := startEvSim(t, "tagged", 1000, 0)
	s.complete(evPrompt("before", 8))
	s.waitConverged()
	s.rep.CutKVEvents()
	before := s.rep.Stats().KVEventBatches
	cut := evPrompt("during the cut", 10)
	s.complete(cut)
	// A batch published while cut is withheld: the next one shows a gap.
	wait.For(t, 10*time.Second, "a withheld batch", func() bool { return s.rep.Stats().KVEventBatches > before })
	s.rep.RestoreKVEvents()
	s.complete(evPrompt("after", 8))
	s.waitConverged()
	if got := s.promptHeld(cut); got != len(cut)/sim.BytesPerToken {
		t.Fatalf("the prompt served during the cut: %d tokens held", got)
	}
	if st := s.ev.Status(s.be); st.Gaps == 0 || st.Replays == 0 || st.Resets != 0 || !st.Live || !st.Complete {
		t.Fatalf("status %+v", st)
	}
}

// TestEventsFollowSimSilence: a stream that stops without a gap while
// requests are sent to the replica makes it approximate past MaxSilence;
// an idle replica's silence does not; the batch after the cut makes it
// live again, its gap replayed.
func TestEventsFollowSimSilence(t *testing.T) {
	const silence = 100 * time.Millisecond
	s := startEvSim(t, "tagged", 1000, 0, func(o *EventsOptions) { o.MaxSilence = silence })
	s.complete(evPrompt("before", 8))
	s.waitConverged()
	time.Sleep(3 * silence)
	if !s.ev.Live(s.be) {
		t.Fatal("an idle replica's silence made it not live")
	}
	s.rep.CutKVEvents()
	before := s.rep.Stats().KVEventBatches
	for range SilentRequests {
		s.be.Acquire()() // what the proxy counts for each request routed there
	}
	s.complete(evPrompt("during the cut", 10))
	wait.For(t, 10*time.Second, "a withheld batch", func() bool { return s.rep.Stats().KVEventBatches > before })
	wait.For(t, 10*time.Second, "the silent replica to stop being live", func() bool { return !s.ev.Live(s.be) })
	if st := s.ev.Status(s.be); !st.Connected || st.Gaps != 0 {
		t.Fatalf("status %+v: a silence, not a lost connection or a gap", st)
	}
	s.rep.RestoreKVEvents()
	s.complete(evPrompt("after", 8))
	s.waitConverged()
	if st := s.ev.Status(s.be); !st.Live || st.Gaps == 0 || st.Replays == 0 || st.Resets != 0 {
		t.Fatalf("after the cut: status %+v", st)
	}
}

// TestEventsFollowSimRestart: an engine restart (sequence back to 0, cache
// empty, no AllBlocksCleared) drops the replica's precise state; what
// follows builds it again.
func TestEventsFollowSimRestart(t *testing.T) {
	s := startEvSim(t, "positional", 1000, 0)
	old := evPrompt("old", 10)
	s.complete(old)
	s.waitConverged()
	wait.For(t, 10*time.Second, "the restart", func() bool { return s.rep.RestartKVEvents() == nil })
	s.seqBase = s.rep.Stats().KVEventBatches
	fresh := evPrompt("new", 6)
	for i := 0; s.ev.Status(s.be).Resets == 0; i++ {
		if i == 200 {
			t.Fatalf("the restart was not seen: %+v", s.ev.Status(s.be))
		}
		s.complete(evPrompt(fmt.Sprint("rejoin", i), 2))
		time.Sleep(10 * time.Millisecond)
	}
	s.complete(fresh)
	s.waitConverged()
	if got := s.promptHeld(old); got != 0 {
		t.Fatalf("the prompt from before the restart holds %d tokens", got)
	}
	if got := s.promptHeld(fresh); got != len(fresh)/sim.BytesPerToken {
		t.Fatalf("the prompt after the restart: %d tokens held", got)
	}
	if st := s.ev.Status(s.be); st.Restarts == 0 || !st.Live || !st.Complete {
		t.Fatalf("status %+v", st)
	}
}

// evPublisher publishes batches to a followed backend over real sockets.
type evPublisher struct {
	t   *testing.T
	pub *kvevents.Publisher
	ix  *index.Index
	be  *backends.Replica
	ev  *Events

	mu    sync.Mutex
	lives []bool // what OnLive said, in order

	pubSeq int64 // batches published (the next one's sequence)
}

func (p *evPublisher) onLive(rep *backends.Replica, live bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rep != p.be {
		p.t.Errorf("OnLive of %s", rep.Name())
	}
	p.lives = append(p.lives, live)
}

func (p *evPublisher) livesSaid() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.lives)
}

// startEvPublisher starts a publisher keeping keep batches for replay, to
// follow.
func startEvPublisher(t *testing.T, enc kvevents.Encoding, keep int) *evPublisher {
	t.Helper()
	pub, err := kvevents.NewPublisher(kvevents.PubOptions{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Encoding: enc, Keep: keep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	p := &evPublisher{t: t, pub: pub, ix: evTestIndex(), be: evTestFleet(t, 1)[0]}
	p.ev, err = NewEvents(EventsOptions{Index: p.ix, MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		OnLive: p.onLive, LiveCheck: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// follow starts following the publisher.
func (p *evPublisher) follow(ctx context.Context) {
	p.t.Helper()
	if err := p.ev.Follow(ctx, p.be, Endpoint{Endpoint: p.pub.Addr(), ReplayEndpoint: p.pub.ReplayAddr()}); err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { p.ev.Stop(p.be) })
	// Until the subscription is through, batches are lost (and replayed
	// once one arrives): publish empty ones until one is applied.
	for i := 0; p.ev.Status(p.be).Batches == 0; i++ {
		if i == 500 {
			p.t.Fatal("nothing delivered")
		}
		p.publish()
		time.Sleep(10 * time.Millisecond)
	}
}

// evWitness is a plain subscription to an evPublisher, to know what went
// out.
type evWitness struct {
	t   *testing.T
	sub *kvevents.Subscriber
}

// evNop is a kvevents.Handler that keeps nothing.
type evNop struct{}

func (evNop) Apply(kvevents.Batch) {}
func (evNop) Reset(string)         {}

// witness subscribes to the publisher and returns once it receives what is
// published (empty batches are published until then).
func (p *evPublisher) witness() *evWitness {
	p.t.Helper()
	ctx, cancel := context.WithCancel(p.t.Context())
	p.t.Cleanup(cancel)
	w := &evWitness{t: p.t}
	sub, err := kvevents.Subscribe(ctx, kvevents.SubOptions{Endpoint: p.pub.Addr(), Handler: evNop{}})
	if err != nil {
		p.t.Fatal(err)
	}
	w.sub = sub
	for i := 0; sub.Status().Batches == 0; i++ {
		if i == 500 {
			p.t.Fatal("the witness received nothing")
		}
		p.publish()
		time.Sleep(10 * time.Millisecond)
	}
	return w
}

// waitFor returns once the witness received batch seq.
func (w *evWitness) waitFor(seq int64) {
	w.t.Helper()
	wait.For(w.t, 10*time.Second, fmt.Sprintf("the witness to receive batch %d", seq), func() bool { return w.sub.Status().Seq >= seq })
}

// lastSeq is the sequence of the last batch published.
func (p *evPublisher) lastSeq() int64 { return p.pubSeq - 1 }

func (p *evPublisher) publish(evs ...kvevents.Event) {
	p.t.Helper()
	if err := p.pub.Publish(kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs}); err != nil {
		p.t.Fatal(err)
	}
	p.pubSeq++
}

// applied waits until every batch published so far is applied.
func (p *evPublisher) applied(seq int64) {
	p.t.Helper()
	wait.For(p.t, 10*time.Second, fmt.Sprintf("batch %d", seq), func() bool { return p.ev.Status(p.be).Seq >= seq })
}

// TestEventsFollowPublisher: over real sockets, hybrid groups, bad spans
// and runs under unknown parents are counted and left out; a gap the
// replay can no longer fill drops the state, which the next batches build
// again; the end of the Follow's context takes the replica's entries out.
func TestEventsFollowPublisher(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	p := startEvPublisher(t, kvevents.Tagged, 2)
	p.follow(ctx)
	seq := p.ev.Status(p.be).Seq
	a := evToks(1, 4*evTestBlock)
	attn := evRun(1, 0, a, evTestBlock)
	attn.SpecKind = "full_attention"
	mamba, sliding := attn, attn
	mamba.GroupIdx, mamba.SpecKind = 1, "mamba"
	sliding.GroupIdx, sliding.SpecKind = 2, "sliding_window"
	bad := evRun(20, 0, evToks(2, 2*evTestBlock), evTestBlock)
	bad.TokenIDs = bad.TokenIDs[1:]
	p.publish(attn, mamba, sliding)
	p.publish(bad, evRun(30, 29, evToks(3, 3*evTestBlock), evTestBlock))
	p.publish(kvevents.BlockRemoved{BlockHashes: []uint64{2}, GroupIdx: 1})
	p.applied(seq + 3)
	st := p.ev.Status(p.be)
	if st.Skipped != 4+4+2+1 || st.Unplaceable != 3 || st.Stored != 4 || !st.Live || st.Lag < 0 {
		t.Fatalf("status %+v", st)
	}
	if got := evHeld(p.ix, evKey(evTestModel, a), p.be); got != len(a) {
		t.Fatalf("%d tokens of the attention run held", got)
	}
	// Batches withheld past what the replay keeps: a gap no replay fills.
	b := evToks(4, 2*evTestBlock)
	for range 3 {
		if err := p.pub.Withhold(kvevents.Batch{Events: []kvevents.Event{evRun(40, 0, b, evTestBlock)}}); err != nil {
			t.Fatal(err)
		}
	}
	p.publish(evRun(50, 0, b, evTestBlock))
	if st.Resets != 0 || !st.Complete {
		t.Fatalf("before the gap: %+v", st)
	}
	p.applied(seq + 7)
	st = p.ev.Status(p.be)
	if st.Resets == 0 || !st.Live || st.Complete || evHeld(p.ix, evKey(evTestModel, a), p.be) != 0 {
		t.Fatalf("after a gap the replay cannot fill: %+v, %d tokens of the old run held", st, evHeld(p.ix, evKey(evTestModel, a), p.be))
	}
	if got := evHeld(p.ix, evKey(evTestModel, b), p.be); got != len(b) {
		t.Fatalf("the run after the reset: %d tokens held", got)
	}
	cancel()
	wait.For(t, 10*time.Second, "the end of the Follow", func() bool { return !p.ev.Status(p.be).Followed })
	if p.ev.Live(p.be) || evHeldAll(p.ix, p.be) != 0 {
		t.Fatalf("after the context ended: live %v, %d tokens held", p.ev.Live(p.be), evHeldAll(p.ix, p.be))
	}
	// OnLive said live at the first batch, not live at the reset, live at
	// the batch after it, not live at the end; each call a change.
	lives := p.livesSaid()
	if len(lives) < 4 || !lives[0] || lives[len(lives)-1] {
		t.Fatalf("OnLive said %v", lives)
	}
	for i := 1; i < len(lives); i++ {
		if lives[i] == lives[i-1] {
			t.Fatalf("OnLive said %v: a call without a change", lives)
		}
	}
}

// TestEventsLiveConnectionLost: a replica whose publisher goes away stops
// being live while still followed, and OnLive says so.
func TestEventsLiveConnectionLost(t *testing.T) {
	p := startEvPublisher(t, kvevents.Tagged, 10)
	p.follow(t.Context())
	if !p.ev.Live(p.be) {
		t.Fatalf("not live: %+v", p.ev.Status(p.be))
	}
	if err := p.pub.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "OnLive to say not live", func() bool {
		l := p.livesSaid()
		return len(l) == 2 && l[0] && !l[1]
	})
	if st := p.ev.Status(p.be); !st.Followed || st.Live || st.Connected {
		t.Fatalf("status %+v", st)
	}
}

// TestEventsFollowSGLangPages: SGLang's events (positional, one
// BlockStored per page of one token, no medium) key the pages' tokens in
// key blocks; removing pages from the last one back takes the key values
// their tokens belong to.
func TestEventsFollowSGLangPages(t *testing.T) {
	p := startEvPublisher(t, kvevents.Positional, 100)
	p.follow(t.Context())
	seq := p.ev.Status(p.be).Seq
	toks := evToks(1, 40)
	pages := make([]kvevents.Event, 0, len(toks))
	for i, tok := range toks {
		ev := kvevents.BlockStored{BlockHashes: []uint64{uint64(1000 + i)}, TokenIDs: []uint32{tok}, BlockSize: 1} //nolint:gosec // small
		if i > 0 {
			ev.ParentHash, ev.HasParent = uint64(999+i), true //nolint:gosec // small
		}
		pages = append(pages, ev)
	}
	p.publish(pages...)
	p.applied(seq + 1)
	key := evKey(evTestModel, toks)
	if got := evHeld(p.ix, key, p.be); got != 2*evTestBlock || len(key) != 2 {
		t.Fatalf("%d tokens held of %d pages", got, len(toks))
	}
	for i := len(toks) - 1; i >= 20; i-- {
		p.publish(kvevents.BlockRemoved{BlockHashes: []uint64{uint64(1000 + i)}}) //nolint:gosec // small
	}
	p.applied(seq + 21)
	if got := evHeld(p.ix, key, p.be); got != evTestBlock {
		t.Fatalf("after removing pages 20 on: %d tokens held", got)
	}
	if st := p.ev.Status(p.be); st.Blocks != 20 || st.Stored != 40 || st.Removed != 20 {
		t.Fatalf("status %+v", st)
	}
}

// TestEventsFollowLongRunning: an engine that published more batches than
// its replay keeps before the Follow began is live once a batch arrives,
// but not complete: the runs chained to blocks stored in the batches
// missed are counted unplaceable. AllBlocksCleared makes it complete.
func TestEventsFollowLongRunning(t *testing.T) {
	p := startEvPublisher(t, kvevents.Positional, 2)
	a := evToks(1, 3*evTestBlock)
	// A witness subscribed before these batches sees them go out: the
	// publisher sends asynchronously, and a batch still queued when the
	// Follow connects would reach it live.
	w := p.witness()
	p.publish(evRun(1, 0, a[:evTestBlock], evTestBlock))
	for range 3 {
		p.publish()
	}
	w.waitFor(p.lastSeq())
	p.follow(t.Context())
	seq := p.ev.Status(p.be).Seq
	p.publish(evRun(2, 1, a[evTestBlock:], evTestBlock))
	p.applied(seq + 1)
	st := p.ev.Status(p.be)
	if !st.Live || st.Complete || st.Resets == 0 || st.Unplaceable != 2 || evHeldAll(p.ix, p.be) != 0 {
		t.Fatalf("status %+v, %d tokens held", st, evHeldAll(p.ix, p.be))
	}
	p.publish(kvevents.AllBlocksCleared{}, evRun(10, 0, a, evTestBlock))
	p.applied(st.Seq + 1)
	if st := p.ev.Status(p.be); !st.Complete || evHeld(p.ix, evKey(evTestModel, a), p.be) != len(a) {
		t.Fatalf("after the clear: %+v", st)
	}
}

// TestEventsUnplaceableStreamIsNotLive: a stream whose stored blocks
// mostly cannot be placed (every run under a parent never reported, as
// an engine that writes made-up parents sends) leaves the replica not
// live: routed on the approximate key, never called precise. Once the
// blocks it places catch up, it is live again.
func TestEventsUnplaceableStreamIsNotLive(t *testing.T) {
	p := startEvPublisher(t, kvevents.Tagged, 2)
	p.follow(t.Context())
	seq := p.ev.Status(p.be).Seq
	p.publish(evRun(1, 0, evToks(1, evTestBlock), evTestBlock))
	p.applied(seq + 1)
	if st := p.ev.Status(p.be); !st.Live {
		t.Fatalf("a placed run: %+v", st)
	}
	// Runs of 8 blocks, each under a parent no event stored.
	for i := range UnplaceableFloor / 8 {
		p.publish(evRun(uint64(1000+16*i), uint64(900+i), evToks(uint32(10+i), 8*evTestBlock), evTestBlock)) //nolint:gosec // small
	}
	p.applied(seq + 1 + UnplaceableFloor/8)
	if st := p.ev.Status(p.be); st.Live || st.Unplaceable < UnplaceableFloor || p.ev.Live(p.be) {
		t.Fatalf("after %d unplaceable blocks: %+v", UnplaceableFloor, st)
	}
	// Sequences it can place: live once they pass a quarter of the rest.
	st := p.ev.Status(p.be)
	n := int(st.Unplaceable)/UnplaceableRatio + 1 - int(st.Stored)
	for i := range n {
		p.publish(evRun(uint64(5000+i), 0, evToks(uint32(100+i), evTestBlock), evTestBlock)) //nolint:gosec // small
	}
	p.applied(st.Seq + int64(n))
	if st := p.ev.Status(p.be); !st.Live {
		t.Fatalf("after %d placed blocks: %+v", n, st)
	}
}
