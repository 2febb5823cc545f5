package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// recordedBatch is one batch a recordingSink got.
type recordedBatch struct {
	ts      float64
	events  []cacheEvent
	dropped bool
}

// recordingSink keeps every batch published to it.
type recordingSink struct {
	mu      sync.Mutex
	batches []recordedBatch
	closed  bool
	fail    bool // publish fails and keeps nothing
}

func (s *recordingSink) publish(ts float64, evs []cacheEvent, dropped bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail {
		return errors.New("failing")
	}
	s.batches = append(s.batches, recordedBatch{ts, evs, dropped})
	return nil
}

func (s *recordingSink) endpoints() (string, string) { return "test", "" }

func (s *recordingSink) restart() error { return nil }

func (s *recordingSink) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *recordingSink) all() []recordedBatch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// startEventReplica serves a replica with KV events published to a
// recordingSink on 127.0.0.1.
func startEventReplica(t *testing.T, mod func(*Config)) (*Replica, string, *recordingSink) {
	t.Helper()
	cfg := fastConfig()
	cfg.KVEvents = true
	if mod != nil {
		mod(&cfg)
	}
	sink := &recordingSink{}
	rep, err := newReplica(cfg, func(*Config) (batchSink, error) { return sink, nil })
	if err != nil {
		t.Fatal(err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = rep.Serve(ctx, ln)
	}()
	t.Cleanup(func() {
		cancel()
		<-served
		rep.Close()
	})
	return rep, "http://" + ln.Addr().String(), sink
}

// flushEvents waits until every event the replica logged is published.
func flushEvents(t *testing.T, r *Replica) {
	t.Helper()
	waitFor(t, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.events.pending) == 0
	})
	r.evStream.mu.Lock()
	defer r.evStream.mu.Unlock()
}

// cacheModel is what a subscriber knows of a replica's cache from its
// events: the keys held per medium.
type cacheModel map[string]map[uint64]bool

// apply plays the events of batches into m, checking each event against
// what m already holds: stored runs chain to their parent and carry
// exactly their blocks' tokens, removals name held keys.
func (m cacheModel) apply(t *testing.T, bs int, batches []recordedBatch) {
	t.Helper()
	for _, b := range batches {
		if b.ts < float64(time.Now().Add(-time.Minute).Unix()) || len(b.events) == 0 {
			t.Fatalf("batch ts %v with %d events", b.ts, len(b.events))
		}
		for _, e := range b.events {
			switch e.kind {
			case blockStored:
				held := m[e.medium]
				if held == nil {
					held = map[uint64]bool{}
					m[e.medium] = held
				}
				if len(e.tokens) != len(e.keys)*bs || len(e.keys) == 0 {
					t.Fatalf("stored %d keys with %d tokens", len(e.keys), len(e.tokens))
				}
				parent, has := keyRoot, e.hasParent
				if has {
					parent = e.parent
				}
				if got := chainKeys(nil, parent, TokenBytes(e.tokens), bs*BytesPerToken); !slices.Equal(got, e.keys) {
					t.Fatalf("stored keys are not the chained keys of their tokens under parent %x (has %v)", e.parent, has)
				}
				for _, k := range e.keys {
					if held[k] {
						t.Fatalf("%s key %x stored twice", e.medium, k)
					}
					held[k] = true
				}
			case blockRemoved:
				for _, k := range e.keys {
					if !m[e.medium][k] {
						t.Fatalf("%s key %x removed but not held", e.medium, k)
					}
					delete(m[e.medium], k)
				}
			case allBlocksCleared:
				clear(m)
			}
		}
	}
}

// heldKeys returns the keys the replica's GPU cache and host tier hold.
func heldKeys(r *Replica) cacheModel {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := cacheModel{mediumGPU: {}, mediumCPU: {}}
	for k := range r.cache.byKey {
		m[mediumGPU][k] = true
	}
	if r.host != nil {
		for k := range r.host.idx {
			m[mediumCPU][k] = true
		}
	}
	return m
}

func sameKeys(a, b map[uint64]bool) bool {
	return len(a) == len(b) && slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b)))
}

// TestEventsFollowCache: a subscriber that plays the events a replica
// published ends up with exactly the keys its cache and host tier hold,
// through stores, hits, duplicates, evictions and a reset, and the keys of
// a request's stored blocks are those of its rendered tokens.
func TestEventsFollowCache(t *testing.T) {
	rep, url, sink := startEventReplica(t, func(c *Config) {
		c.BlockSize = 4
		c.NumGPUBlocks = 60
		c.HostBlocks = 100
	})
	bs := rep.cfg.BlockSize
	p := prompt("first", 200) // 50 tokens: 12 whole blocks
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 9, "ignore_eos": true})
	flushEvents(t, rep)
	m := cacheModel{}
	m.apply(t, bs, sink.all())
	first := sink.all()[0].events[0]
	if first.kind != blockStored || first.medium != mediumGPU || first.hasParent ||
		!slices.Equal(first.keys, blockKeys([]byte(p), bs)[:len(first.keys)]) {
		t.Fatalf("first event %+v", first)
	}
	var stored []uint64
	for _, b := range sink.all() {
		for _, e := range b.events {
			if e.kind == blockStored && e.medium == mediumGPU {
				stored = append(stored, e.keys...)
			}
		}
	}
	// The prompt's 12 blocks and then the answer's (50 + 9 - 1 computed
	// tokens: 14 whole blocks), chained on.
	promptKeys := blockKeys(TokenBytes(TokenIDs([]byte(p))), bs)
	if len(stored) != 14 || !slices.Equal(stored[:12], promptKeys) {
		t.Fatalf("stored %d GPU keys, want the 12 prompt keys then 2 of the answer", len(stored))
	}

	// The same prompt again hits; a long different one evicts; then the
	// first again, so that its keys come back.
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 9, "ignore_eos": true})
	for i := range 4 {
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("other", i), 150), "max_tokens": 3})
	}
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 2})
	rep.Close() // publishes the rest
	m = cacheModel{}
	m.apply(t, bs, sink.all())
	held := heldKeys(rep)
	if !sameKeys(m[mediumGPU], held[mediumGPU]) || !sameKeys(m[mediumCPU], held[mediumCPU]) || len(held[mediumCPU]) < 30 {
		t.Fatalf("events say GPU %d CPU %d keys; the replica holds %d and %d",
			len(m[mediumGPU]), len(m[mediumCPU]), len(held[mediumGPU]), len(held[mediumCPU]))
	}
	if !sink.closed {
		t.Fatal("sink not closed")
	}
}

// TestEventsEvictionAndClear: with a host tier smaller than the traffic,
// both media evict (BlockRemoved), and a reset publishes AllBlocksCleared
// after which a subscriber holds nothing, like the replica.
func TestEventsEvictionAndClear(t *testing.T) {
	rep, url, sink := startEventReplica(t, func(c *Config) {
		c.BlockSize = 4
		c.NumGPUBlocks = 40
		c.HostBlocks = 50
	})
	for i := range 8 { // 12 whole blocks each
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("evict", i), 200), "max_tokens": 2})
	}
	flushEvents(t, rep)
	removed := map[string]int{}
	for _, b := range sink.all() {
		for _, e := range b.events {
			if e.kind == blockRemoved {
				removed[e.medium] += len(e.keys)
			}
		}
	}
	if removed[mediumGPU] == 0 || removed[mediumCPU] == 0 {
		t.Fatalf("removed %v", removed)
	}
	if !rep.ResetPrefixCache() {
		t.Fatal("reset refused")
	}
	complete(t, url, map[string]any{"prompt": prompt("after", 40), "max_tokens": 2})
	rep.Close()
	all := sink.all()
	m := cacheModel{}
	m.apply(t, rep.cfg.BlockSize, all)
	held := heldKeys(rep)
	if !sameKeys(m[mediumGPU], held[mediumGPU]) || !sameKeys(m[mediumCPU], held[mediumCPU]) || len(held[mediumGPU]) == 0 {
		t.Fatalf("events say GPU %d CPU %d keys; the replica holds %d and %d",
			len(m[mediumGPU]), len(m[mediumCPU]), len(held[mediumGPU]), len(held[mediumCPU]))
	}
	cleared := 0
	for _, b := range all {
		for _, e := range b.events {
			if e.kind == allBlocksCleared {
				cleared++
			}
		}
	}
	if cleared != 1 {
		t.Fatalf("%d AllBlocksCleared", cleared)
	}
}

// TestEventsCut: batches published while the stream is cut are marked
// dropped, and the ones after the restore are not.
func TestEventsCut(t *testing.T) {
	rep, url, sink := startEventReplica(t, nil)
	complete(t, url, map[string]any{"prompt": prompt("before", 100), "max_tokens": 2})
	flushEvents(t, rep)
	rep.CutKVEvents()
	n := len(sink.all())
	complete(t, url, map[string]any{"prompt": prompt("during", 100), "max_tokens": 2})
	flushEvents(t, rep)
	rep.RestoreKVEvents()
	m := len(sink.all())
	complete(t, url, map[string]any{"prompt": prompt("after", 100), "max_tokens": 2})
	flushEvents(t, rep)
	if st := rep.Stats(); st.KVEventBatches != int64(len(sink.all())) || st.KVEventErrors != 0 {
		t.Fatalf("%d batches, %d errors; the sink got %d", st.KVEventBatches, st.KVEventErrors, len(sink.all()))
	}
	sink.mu.Lock()
	sink.fail = true
	sink.mu.Unlock()
	complete(t, url, map[string]any{"prompt": prompt("failing", 100), "max_tokens": 2})
	rep.Close()
	if st := rep.Stats(); st.KVEventErrors == 0 || st.KVEventBatches != int64(len(sink.all())) {
		t.Fatalf("with a failing publisher: %d batches, %d errors", st.KVEventBatches, st.KVEventErrors)
	}
	for i, b := range sink.all() {
		if b.dropped != (i >= n && i < m) {
			t.Fatalf("batch %d of %d (cut from %d to %d): dropped %v", i, len(sink.all()), n, m, b.dropped)
		}
	}
	if len(sink.all()) <= m {
		t.Fatal("nothing published after the restore")
	}
}

// TestStoredRuns: every run of fresh keys is one BlockStored chained to the
// key before it, with its own blocks' tokens.
func TestStoredRuns(t *testing.T) {
	const bs = 2
	data := []byte(prompt("runs", 5*bs*BytesPerToken))
	keys := chainKeys(nil, 77, data, bs*BytesPerToken)
	l := &eventLog{bb: bs * BytesPerToken}
	l.storedRuns(mediumCPU, keys, data, 77, true, []bool{true, false, true, true, false})
	head := blockKeys(data[:2*bs*BytesPerToken], bs)
	l.storedRuns(mediumGPU, head, data[:2*bs*BytesPerToken], 99, false, []bool{true, true})
	evs := l.take()
	if len(evs) != 3 || l.pending != nil {
		t.Fatalf("%d events", len(evs))
	}
	m := cacheModel{}
	m.apply(t, bs, []recordedBatch{{ts: float64(time.Now().Unix()), events: evs}})
	want := []struct {
		keys      []uint64
		parent    uint64
		hasParent bool
	}{{keys[:1], 77, true}, {keys[2:4], keys[1], true}, {head, 99, false}}
	for i, w := range want {
		e := evs[i]
		if !slices.Equal(e.keys, w.keys) || e.parent != w.parent || e.hasParent != w.hasParent {
			t.Errorf("event %d: keys %x parent %x/%v, want %x parent %x/%v", i, e.keys, e.parent, e.hasParent, w.keys, w.parent, w.hasParent)
		}
	}
}
