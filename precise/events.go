package precise

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
)

// DefaultMaxBlocks is EventsOptions.MaxBlocks when it is 0.
const DefaultMaxBlocks = 4 << 20

// EventsOptions configure NewEvents.
type EventsOptions struct {
	// Index receives the engines' blocks as SourceEngine entries; required.
	Index *index.Index
	Log   *zap.Logger // nil for none
	// Model is the model name a replica's blocks are keyed under when an
	// event names no LoRA adapter (lora_name): the name the request side
	// passes to tokenize.AppendExactKey for the same tokens. nil means the
	// replica's first model (Replica.Models), "" when it has none yet.
	Model func(rep *backends.Replica) string
	// BlockSize is the key block in tokens; 0 means Index.KeyBlock(), and
	// any other value must equal it (the Index counts tokens by it).
	BlockSize int
	// MaxBlocks bounds the engine blocks kept per replica (those the
	// engine holds, and removed ones whose children it still holds),
	// whatever the replica claims; 0 means DefaultMaxBlocks. Below it a
	// replica whose capacity is known is bounded by twice its capacity
	// in blocks (at least 1,024): its configured cache_tokens, else the
	// GPU blocks its metrics report while it reports no block of another
	// tier. An engine's cache bounds them already; a replica that goes
	// past its bound anyway (events lost without a gap, or a misbehaving
	// engine) has its precise state dropped, as for a Reset, and rebuilt
	// from the events that follow, counted in Overflows.
	MaxBlocks int
	// MaxEventBytes bounds a KV-event message, in bytes
	// (kvevents.SubOptions.MaxEventBytes); 0 means its default.
	MaxEventBytes int64
	// MaxSilence, when positive, makes a replica approximate once no
	// message came from it for that long while at least SilentRequests
	// requests were sent to it since its last batch (an engine that
	// prefills stores blocks; an idle one is silent): a stream that stops
	// without a gap (a publisher stuck, a proxy that holds its messages)
	// leaves the replica's exact entries unrouted until its next batch,
	// rather than routed on blocks its engine may have evicted since. 0:
	// a silent stream stays live.
	MaxSilence time.Duration
	// OnLive, when not nil, is called with Live(rep) each time it changes
	// (it starts false): after a batch, a Reset, the end of a Follow (false,
	// before its entries are evicted), and at every LiveCheck for what
	// changes between batches (a lost connection, MaxSilence). Calls for
	// one replica are in order, from Events' goroutines; it must not block
	// or call back into Events.
	OnLive func(rep *backends.Replica, live bool)
	// LiveCheck is how often OnLive's check runs between batches; 0 means
	// 1 s, or a quarter of MaxSilence if that is less.
	LiveCheck time.Duration
	// Subscription tuning passed to kvevents.Subscribe; 0 for its defaults.
	ReplayTimeout, MinBackoff, MaxBackoff time.Duration
}

// Endpoint is where a replica publishes its KV events (its
// backends[].kv_events, with the replica's own host where it names none).
type Endpoint = backends.KVEvents

// ReplicaStatus is a snapshot of what Events follows of one replica, for
// /debug/backends and metrics.
type ReplicaStatus struct {
	// Followed is whether Follow runs for the replica.
	Followed bool
	// Live is Events.Live.
	Live bool
	// Connected is whether the subscription is connected now.
	Connected bool
	// Listening is whether kvroute listens for the engine's publisher now
	// (Endpoint.Bind); with Connected false, no publisher is connected.
	Listening bool
	// Complete is whether the Index holds every block the engine holds
	// (and can hit), as far as its events tell: nothing was missed since
	// the Follow began or since the engine's cache was last empty (an
	// AllBlocksCleared, a restart). It is false after batches were lost
	// that no replay gave back (a Follow of an engine that has run longer
	// than its replay reaches back starts so) and after an overflow: the
	// engine then holds blocks, hot shared prefixes among them, that the
	// Index learns of only once they are stored again.
	Complete bool
	// Lag is how far behind its engine timestamp the last batch was
	// applied.
	Lag time.Duration
	// LastEvent is when the last message arrived (zero before one).
	LastEvent time.Time
	// Blocks is the number of engine blocks kept now.
	Blocks int
	// Seq is the sequence of the last batch applied, -1 before any.
	Seq int64
	// Of the subscription (kvevents.Status): batches applied, sequence
	// gaps, engine restarts seen, replays asked for, resets (state
	// dropped because batches were lost or the engine restarted), payloads
	// that could not be read, connections made.
	Batches, Gaps, Restarts, Replays, Resets, DecodeErrors, Connects uint64
	// Stored and Removed count the blocks applied from BlockStored and
	// BlockRemoved events, Clears the AllBlocksCleared events.
	Stored, Removed, Clears uint64
	// Skipped counts the blocks not indexed: of non-attention cache groups
	// (Mamba, sliding window), of spans whose tokens are not their blocks
	// times the block size, and removals in those groups.
	Skipped uint64
	// Unplaceable counts the stored blocks left out because their parent
	// block is unknown (its store was missed or dropped by a reset), and
	// those cut short by an overflow; UnknownRemoved the removals of
	// blocks not kept.
	Unplaceable, UnknownRemoved uint64
	// Overflows counts the times the replica's state went past its bound
	// (MaxBlocks) and was dropped.
	Overflows uint64
	// Rejected counts the subscription's connections closed and messages
	// left out for what the engine's side sent, by reason.
	Rejected kvevents.Rejects
}

// Events keeps the Index's SourceEngine entries of each followed replica
// equal to what its engine reports holding. See the package doc. It is
// safe for concurrent use.
type Events struct {
	o   EventsOptions
	log *zap.Logger

	mu sync.RWMutex
	by map[*backends.Replica]*evFollow
}

// NewEvents checks o and returns an Events following no replica.
func NewEvents(o EventsOptions) (*Events, error) {
	if o.Index == nil {
		return nil, errors.New("precise: events need an Index")
	}
	if o.BlockSize == 0 {
		o.BlockSize = o.Index.KeyBlock()
	}
	if o.BlockSize != o.Index.KeyBlock() {
		return nil, fmt.Errorf("precise: key block %d differs from the Index's %d", o.BlockSize, o.Index.KeyBlock())
	}
	if o.MaxBlocks <= 0 {
		o.MaxBlocks = DefaultMaxBlocks
	}
	if o.Model == nil {
		o.Model = evFirstModel
	}
	if o.LiveCheck <= 0 {
		o.LiveCheck = time.Second
		if o.MaxSilence > 0 {
			o.LiveCheck = min(o.LiveCheck, max(o.MaxSilence/4, time.Millisecond))
		}
	}
	log := o.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Events{o: o, log: log.Named("precise"), by: make(map[*backends.Replica]*evFollow)}, nil
}

// evFirstModel is the default EventsOptions.Model.
func evFirstModel(rep *backends.Replica) string {
	if ms := rep.Models(); len(ms) > 0 {
		return ms[0]
	}
	return ""
}

// evCounters are a replica's counters of applied events.
type evCounters struct {
	stored, removed, clears, skipped atomic.Uint64
	unplaceable, unknownRemoved      atomic.Uint64
	overflows                        atomic.Uint64
	blocks                           atomic.Int64
}

// evFollow is one followed replica: its subscription and block state.
type evFollow struct {
	e      *Events
	rep    *backends.Replica
	cancel context.CancelFunc
	done   chan struct{} // closed once the state is dropped
	sub    atomic.Pointer[kvevents.Subscriber]

	ready chan struct{} // closed once sub is set

	// synced is whether a batch was applied since the start or the last
	// reset: the state then goes on from what the engine reported.
	synced atomic.Bool
	// complete is whether the state holds all the engine reported since
	// its cache was last known empty (see ReplicaStatus.Complete).
	complete atomic.Bool
	restarts uint64      // the subscription's Restarts at the last Reset
	ended    atomic.Bool // the subscription stopped
	c        evCounters
	// sentAt is rep.Dispatched() when the last batch was applied, or the
	// follow began (EventsOptions.MaxSilence).
	sentAt atomic.Uint64

	mu      sync.Mutex // guards st and stopped
	st      *evState
	stopped bool

	liveMu  sync.Mutex // orders OnLive calls
	wasLive bool
}

// Apply implements kvevents.Handler.
func (f *evFollow) Apply(b kvevents.Batch) {
	<-f.ready
	f.mu.Lock()
	if f.stopped {
		f.mu.Unlock()
		return
	}
	clears, overflows := f.c.clears.Load(), f.c.overflows.Load()
	f.st.apply(b, time.Now())
	f.c.blocks.Store(int64(f.st.used()))
	switch {
	case f.c.overflows.Load() != overflows:
		f.complete.Store(false) // blocks the engine holds were dropped
	case f.c.clears.Load() != clears:
		f.complete.Store(true) // the engine's cache was emptied
	}
	f.synced.Store(true)
	f.sentAt.Store(f.rep.Dispatched())
	f.mu.Unlock()
	f.notify()
}

// Reset implements kvevents.Handler: what the engine held before is no
// longer known, so all of it goes. After an engine restart the engine's
// cache is empty too and the state complete; after batches lost, it is
// not.
func (f *evFollow) Reset(string) {
	<-f.ready
	r := f.sub.Load().Status().Restarts
	f.complete.Store(r != f.restarts)
	f.restarts = r
	f.synced.Store(false)
	f.notify()
	f.drop()
}

// notify calls OnLive if Live changed since its last call.
func (f *evFollow) notify() {
	if f.e.o.OnLive == nil {
		return
	}
	f.liveMu.Lock()
	defer f.liveMu.Unlock()
	live := false
	if !f.ended.Load() {
		live = f.e.live(f, f.sub.Load().Status(), time.Now())
	}
	if live != f.wasLive {
		f.wasLive = live
		f.e.o.OnLive(f.rep, live)
	}
}

// watch runs notify every LiveCheck until ctx ends.
func (f *evFollow) watch(ctx context.Context) {
	t := time.NewTicker(f.e.o.LiveCheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.notify()
		}
	}
}

// drop evicts every entry the state placed and empties it.
func (f *evFollow) drop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.clear()
	f.c.blocks.Store(0)
}

// Follow subscribes to rep's events at ep and keeps the Index's engine
// entries of rep following them, until ctx ends or Stop(rep); a Follow of a
// replica already followed replaces the earlier one. When it ends, every
// entry it placed is evicted from the Index, once its subscription has
// stopped (Stop waits for that).
func (e *Events) Follow(ctx context.Context, rep *backends.Replica, ep Endpoint) error {
	e.Stop(rep)
	ctx, cancel := context.WithCancel(ctx)
	f := &evFollow{e: e, rep: rep, cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
	f.complete.Store(true) // nothing missed yet
	f.sentAt.Store(rep.Dispatched())
	f.st = newEvState(e.o.Index, rep, e.o.Model, e.o.BlockSize, e.o.MaxBlocks, &f.c)
	so := kvevents.SubOptions{
		Endpoint: ep.Endpoint, ReplayEndpoint: ep.ReplayEndpoint, Topic: ep.Topic,
		Handler: f, Logger: e.log.With(zap.String("backend", rep.Name())),
		ReplayTimeout: e.o.ReplayTimeout, MinBackoff: e.o.MinBackoff, MaxBackoff: e.o.MaxBackoff,
		MaxEventBytes: e.o.MaxEventBytes,
	}
	if ep.Bind {
		so.Bind, so.AllowPeer = true, newPeerFilter(ep.AllowFrom, rep.Spec().URL).allow
	}
	sub, err := kvevents.Subscribe(ctx, so)
	if err != nil {
		cancel()
		return fmt.Errorf("precise: backend %s: %w", rep.Name(), err)
	}
	f.sub.Store(sub)
	close(f.ready)
	e.mu.Lock()
	e.by[rep] = f
	e.mu.Unlock()
	if e.o.OnLive != nil {
		go f.watch(ctx)
	}
	go func() {
		<-sub.Done() // after ctx ends: no Apply or Reset from here on
		f.mu.Lock()
		f.stopped = true
		f.mu.Unlock()
		f.synced.Store(false)
		f.ended.Store(true)
		f.notify()
		f.drop()
		e.mu.Lock()
		if e.by[rep] == f {
			delete(e.by, rep)
		}
		e.mu.Unlock()
		close(f.done)
	}()
	return nil
}

// Stop ends the Follow of rep, if any, and returns once its entries are
// out of the Index. Call it before the replica's ID can be reused (before
// Router.Forget of a replica that left): the eviction names the ID.
func (e *Events) Stop(rep *backends.Replica) {
	f := e.follow(rep)
	if f == nil {
		return
	}
	f.cancel()
	<-f.done
}

func (e *Events) follow(rep *backends.Replica) *evFollow {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.by[rep]
}

// Live reports whether rep's engine entries in the Index can be routed on
// as the engine's own account of its cache: rep is followed, its
// subscription is connected, a batch was applied since the Follow began
// and since the last Reset (so the initial replay is done and the stream
// flows), its events place most of the blocks they store (Unplaceable),
// and, with MaxSilence, a message came within it. After a Reset
// the replica is live again at the next batch, with only what the engine
// reported since: blocks it kept from before are missing from the Index
// (fewer hits predicted, never hits it does not have). With MaxSilence, a
// replica sent SilentRequests requests since its last batch is live only
// while a message came within it.
func (e *Events) Live(rep *backends.Replica) bool {
	f := e.follow(rep)
	if f == nil || !f.synced.Load() {
		return false
	}
	return e.live(f, f.sub.Load().Status(), time.Now())
}

func (e *Events) live(f *evFollow, st kvevents.Status, now time.Time) bool {
	if !st.Live || !f.synced.Load() || Unplaceable(f.c.stored.Load(), f.c.unplaceable.Load()) || f.rep.TokenizerMismatch() {
		return false
	}
	if e.o.MaxSilence <= 0 || now.Sub(st.LastMessage) <= e.o.MaxSilence {
		return true
	}
	return f.rep.Dispatched()-f.sentAt.Load() < SilentRequests
}

// Unplaceable reports whether the blocks a replica's events stored mostly
// could not be placed (their parent unknown): at least
// UnplaceableFloor of them, and more than UnplaceableRatio times those
// placed. Its Index entries would then hold almost nothing of what the
// engine does, and routing on them would be worse than on the
// approximate key: the replica is not live until placements catch up (a
// stream joined mid-way, whose first runs chain to blocks stored before,
// places the new sequences it reports and does).
func Unplaceable(stored, unplaced uint64) bool {
	return unplaced >= UnplaceableFloor && unplaced > UnplaceableRatio*stored
}

// UnplaceableFloor and UnplaceableRatio: see Unplaceable.
const (
	UnplaceableFloor = 64
	UnplaceableRatio = 4
)

// SilentRequests is how many requests sent to a replica since its last
// batch make a silence past EventsOptions.MaxSilence a stopped stream
// rather than an idle engine.
const SilentRequests = 16

// Status reports what is followed of rep (the zero ReplicaStatus when
// rep is not followed).
func (e *Events) Status(rep *backends.Replica) ReplicaStatus {
	f := e.follow(rep)
	if f == nil {
		return ReplicaStatus{}
	}
	st := f.sub.Load().Status()
	return ReplicaStatus{
		Followed: true, Live: e.live(f, st, time.Now()), Connected: st.Live, Listening: st.Listening, Complete: f.complete.Load(),
		Lag: st.LastLag, LastEvent: st.LastMessage, Blocks: int(f.c.blocks.Load()), Seq: st.Seq,
		Batches: st.Batches, Gaps: st.Gaps, Restarts: st.Restarts, Replays: st.Replays, Resets: st.Resets,
		DecodeErrors: st.DecodeErrors, Connects: st.Connects,
		Stored: f.c.stored.Load(), Removed: f.c.removed.Load(), Clears: f.c.clears.Load(),
		Skipped: f.c.skipped.Load(), Unplaceable: f.c.unplaceable.Load(), UnknownRemoved: f.c.unknownRemoved.Load(),
		Overflows: f.c.overflows.Load(), Rejected: st.Rejected,
	}
}
