package sim

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// The media of KV event blocks, as vLLM names them.
const (
	mediumGPU = "GPU"
	mediumCPU = "CPU" // the host tier
)

// cacheEventKind is the kind of a cacheEvent.
type cacheEventKind uint8

const (
	blockStored cacheEventKind = iota
	blockRemoved
	allBlocksCleared
)

// cacheEvent is one KV cache event of a replica, in vLLM's terms: the keys
// are the replica's own block keys (the engine's block hashes), tokens the
// ids (TokenIDs) of the stored blocks' tokens, parent the key of the block
// before the first stored one.
type cacheEvent struct {
	kind      cacheEventKind
	medium    string
	keys      []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
}

// eventLog collects a replica's cache events between two published batches
// (guarded by Replica.mu).
type eventLog struct {
	bb      int // bytes per block
	pending []cacheEvent
}

// stored logs one BlockStored of keys, whose blocks' bytes are data, the
// first chained to parent.
func (l *eventLog) stored(medium string, keys []uint64, data []byte, parent uint64, hasParent bool) {
	l.pending = append(l.pending, cacheEvent{
		kind:      blockStored,
		medium:    medium,
		keys:      append([]uint64(nil), keys...),
		parent:    parent,
		hasParent: hasParent,
		tokens:    TokenIDs(data),
	})
}

// storedRuns logs one BlockStored for every run of keys whose fresh flag is
// set (keys newly stored; the others were already held). data holds the
// bytes of every key's block, and keys[0] is chained to parent.
func (l *eventLog) storedRuns(medium string, keys []uint64, data []byte, parent uint64, hasParent bool, fresh []bool) {
	for i := 0; i < len(keys); {
		if !fresh[i] {
			i++
			continue
		}
		j := i + 1
		for j < len(keys) && fresh[j] {
			j++
		}
		p, hp := parent, hasParent
		if i > 0 {
			p, hp = keys[i-1], true
		}
		l.stored(medium, keys[i:j], data[i*l.bb:j*l.bb], p, hp)
		i = j
	}
}

// removed logs the eviction of key, into the last event when that is a
// BlockRemoved of the same medium.
func (l *eventLog) removed(medium string, key uint64) {
	if n := len(l.pending); n > 0 {
		if e := &l.pending[n-1]; e.kind == blockRemoved && e.medium == medium {
			e.keys = append(e.keys, key)
			return
		}
	}
	l.pending = append(l.pending, cacheEvent{kind: blockRemoved, medium: medium, keys: []uint64{key}})
}

// cleared logs an AllBlocksCleared.
func (l *eventLog) cleared() {
	l.pending = append(l.pending, cacheEvent{kind: allBlocksCleared})
}

// take returns the pending events and starts a new list.
func (l *eventLog) take() []cacheEvent {
	evs := l.pending
	l.pending = nil
	return evs
}

// batchSink publishes a replica's batches of events.
type batchSink interface {
	// publish sends one batch stamped ts (Unix seconds). While dropped is
	// set the batch takes its sequence number and is kept for replay but
	// not sent.
	publish(ts float64, events []cacheEvent, dropped bool) error
	// endpoints returns the bound event and replay endpoints ("" for no
	// replay).
	endpoints() (events, replay string)
	// restart closes the sockets and binds them again on the same
	// endpoints, with the sequence back at 0 and nothing kept for replay.
	restart() error
	close() error
}

// eventStream is a replica's publishing goroutine: after every engine step
// (or reset) that logged events it publishes them as one batch; events
// logged while a batch is being sent go into the next one.
type eventStream struct {
	// mu is held while a batch is taken and published.
	mu      sync.Mutex
	sink    batchSink
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	cut     atomic.Bool
	batches atomic.Int64 // published or withheld
	errs    atomic.Int64 // publishes that failed
}

func newEventStream(sink batchSink) *eventStream {
	return &eventStream{
		sink: sink,
		kick: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
}

func (s *eventStream) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run publishes r's events until stop is closed, then publishes what is
// left.
func (s *eventStream) run(r *Replica) {
	defer close(s.done)
	for {
		stopping := false
		select {
		case <-s.kick:
		case <-s.stop:
			stopping = true
		}
		s.mu.Lock()
		r.mu.Lock()
		evs := r.events.take()
		r.mu.Unlock()
		if len(evs) > 0 {
			ts := float64(time.Now().UnixNano()) / 1e9
			if s.sink.publish(ts, evs, s.cut.Load()) != nil {
				s.errs.Add(1)
			} else {
				s.batches.Add(1)
			}
		}
		s.mu.Unlock()
		if stopping {
			return
		}
	}
}

// close stops the goroutine and closes the sink.
func (s *eventStream) close() {
	close(s.stop)
	<-s.done
	_ = s.sink.close()
}

// resolveKVEvents checks and defaults the KV event fields.
func (c *Config) resolveKVEvents() error {
	switch c.KVEventsEncoding {
	case "":
		c.KVEventsEncoding = "positional"
	case "positional", "tagged":
	default:
		return fmt.Errorf("sim: KVEventsEncoding %q is neither positional nor tagged", c.KVEventsEncoding)
	}
	if c.KVEventsPort < 0 || c.KVEventsPort > 65535 || c.KVEventsReplayPort > 65535 {
		return fmt.Errorf("sim: KV event ports %d, %d out of range", c.KVEventsPort, c.KVEventsReplayPort)
	}
	if c.KVEventsKeep <= 0 {
		c.KVEventsKeep = 10000
	}
	return nil
}

// KVEventsEndpoint is where a replica publishes its KV events, as kvroute's
// backends[].kv_events names it.
type KVEventsEndpoint struct {
	// Endpoint is the ZMQ PUB endpoint ("tcp://127.0.0.1:port").
	Endpoint string
	// ReplayEndpoint is the ZMQ ROUTER replay endpoint ("" without one).
	ReplayEndpoint string
	// Topic is the topic frame of every message.
	Topic string
}

// KVEventsEndpoints returns where the replica publishes its KV events, or
// the zero value when Config.KVEvents is off.
func (r *Replica) KVEventsEndpoints() KVEventsEndpoint {
	if r.evStream == nil {
		return KVEventsEndpoint{}
	}
	ev, replay := r.evStream.sink.endpoints()
	return KVEventsEndpoint{Endpoint: ev, ReplayEndpoint: replay, Topic: r.cfg.KVEventsTopic}
}

// CutKVEvents cuts the replica's event stream until RestoreKVEvents: the
// batches published meanwhile take their sequence numbers and are kept for
// replay, but no subscriber receives them, so a subscriber sees a gap at
// the first batch after the restore (and can fill it from the replay
// socket while the batches are still kept). It does nothing without
// Config.KVEvents.
func (r *Replica) CutKVEvents() {
	if r.evStream != nil {
		r.evStream.cut.Store(true)
	}
}

// RestoreKVEvents ends a CutKVEvents.
func (r *Replica) RestoreKVEvents() {
	if r.evStream != nil {
		r.evStream.cut.Store(false)
	}
}

// RestartKVEvents makes the replica look restarted to its event
// subscribers, as a vLLM engine that restarts: its prefix cache is dropped
// (GPU and host tier, with no AllBlocksCleared), the events not yet
// published are lost, and the publisher is closed and bound again on the
// same endpoints, its sequence back at 0 and its replay buffer empty. It
// refuses while a running request holds blocks, and without
// Config.KVEvents.
func (r *Replica) RestartKVEvents() error {
	s := r.evStream
	if s == nil {
		return errors.New("sim: KV events are off")
	}
	s.mu.Lock() // no batch in flight
	defer s.mu.Unlock()
	r.mu.Lock()
	if r.cache.pinned > 0 {
		r.mu.Unlock()
		return errors.New("sim: running requests hold blocks")
	}
	r.cache.reset()
	if r.host != nil {
		r.host.reset()
	}
	r.events.take()
	r.mu.Unlock()
	if err := s.sink.restart(); err != nil {
		return fmt.Errorf("sim: %s: restarting the event publisher: %w", r.cfg.Name, err)
	}
	return nil
}

// ResetPrefixCache drops every cached block, on GPU and in the host tier,
// as vLLM's reset_prefix_cache, and reports true; with Config.KVEvents it
// publishes an AllBlocksCleared. As vLLM, it refuses (does nothing and
// reports false) while a running request holds blocks.
func (r *Replica) ResetPrefixCache() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cache.pinned > 0 {
		return false
	}
	r.cache.reset()
	if r.host != nil {
		r.host.reset()
	}
	if r.events != nil {
		r.events.cleared()
		r.evStream.wake()
	}
	return true
}
