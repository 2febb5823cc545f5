package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/kvevents"
)

// startZMQReplica serves a replica publishing its KV events over ZMQ on
// free ports of 127.0.0.1.
func startZMQReplica(t *testing.T, enc string) (*Replica, string) {
	t.Helper()
	rep, url := startReplica(t, func(c *Config) {
		c.BlockSize = 4
		c.NumGPUBlocks = 40
		c.KVEvents = true
		c.KVEventsEncoding = enc
		c.KVEventsTopic = "kv"
	})
	ep := rep.KVEventsEndpoints()
	if !strings.HasPrefix(ep.Endpoint, "tcp://127.0.0.1:") || !strings.HasPrefix(ep.ReplayEndpoint, "tcp://127.0.0.1:") ||
		ep.Endpoint == ep.ReplayEndpoint || ep.Topic != "kv" {
		t.Fatalf("endpoints %+v", ep)
	}
	return rep, url
}

// wireMsg is one message of an event stream: its sequence and payload.
type wireMsg struct {
	seq     int64
	payload []byte
}

// replay asks the replica's replay socket for every batch it keeps from
// sequence from on.
func replay(t *testing.T, rep *Replica, from int64) []wireMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer func() { _ = d.Close() }()
	if err := d.Dial(rep.KVEventsEndpoints().ReplayEndpoint); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsg(binary.BigEndian.AppendUint64(nil, uint64(from)))); err != nil {
		t.Fatal(err)
	}
	var out []wireMsg
	for {
		m, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		f := m.Frames
		if len(f) == 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			t.Fatalf("replay frames %q", m.Frames)
		}
		seq := int64(binary.BigEndian.Uint64(f[0]))
		if seq == -1 {
			return out
		}
		out = append(out, wireMsg{seq, f[1]})
	}
}

// decoded decodes payloads into the batches cacheModel plays.
func decoded(t *testing.T, bs int, msgs []wireMsg) []recordedBatch {
	t.Helper()
	out := make([]recordedBatch, 0, len(msgs))
	for _, m := range msgs {
		b, err := kvevents.Decode(m.payload)
		if err != nil || b.Skipped != 0 {
			t.Fatalf("batch %d: %v (skipped %d)", m.seq, err, b.Skipped)
		}
		rb := recordedBatch{ts: b.TS}
		for _, ev := range b.Events {
			switch ev := ev.(type) {
			case kvevents.BlockStored:
				if ev.BlockSize != bs || !kvevents.Indexable(ev) {
					t.Fatalf("stored block size %d, %d tokens for %d hashes", ev.BlockSize, len(ev.TokenIDs), len(ev.BlockHashes))
				}
				rb.events = append(rb.events, cacheEvent{kind: blockStored, medium: ev.Medium, keys: ev.BlockHashes,
					parent: ev.ParentHash, hasParent: ev.HasParent, tokens: ev.TokenIDs})
			case kvevents.BlockRemoved:
				rb.events = append(rb.events, cacheEvent{kind: blockRemoved, medium: ev.Medium, keys: ev.BlockHashes})
			case kvevents.AllBlocksCleared:
				rb.events = append(rb.events, cacheEvent{kind: allBlocksCleared})
			}
		}
		out = append(out, rb)
	}
	return out
}

// TestZMQEvents: in either encoding, the batches a replica keeps for
// replay carry sequences from 0 and events that rebuild its cache.
func TestZMQEvents(t *testing.T) {
	for _, enc := range []string{"positional", "tagged"} {
		t.Run(enc, func(t *testing.T) {
			rep, url := startZMQReplica(t, enc)
			for i := range 6 { // 12 whole blocks each: the later ones evict
				complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint(enc, i), 200), "max_tokens": 2})
			}
			flushEvents(t, rep)
			msgs := replay(t, rep, 0)
			for i, m := range msgs {
				if m.seq != int64(i) {
					t.Fatalf("message %d has sequence %d", i, m.seq)
				}
				// A map (0x80-0x8f) or an array (0x90-0x9f) of 3.
				if first := m.payload[0]; (enc == "tagged") != (first == 0x83) || (enc == "positional") != (first == 0x93) {
					t.Fatalf("%s payload starts %#x", enc, first)
				}
			}
			m := cacheModel{}
			m.apply(t, rep.cfg.BlockSize, decoded(t, rep.cfg.BlockSize, msgs))
			if held := heldKeys(rep); !sameKeys(m[mediumGPU], held[mediumGPU]) || rep.Stats().CachedBlocks == 0 {
				t.Fatalf("events say %d keys, the replica holds %d", len(m[mediumGPU]), len(held[mediumGPU]))
			}
			if tail := replay(t, rep, int64(len(msgs)-1)); len(tail) != 1 || tail[0].seq != int64(len(msgs)-1) {
				t.Fatalf("replay of the last batch: %d messages", len(tail))
			}
		})
	}
}

// TestZMQCutShowsGap: a subscriber of a stream cut and restored sees a
// gap in the sequence at the first batch after the restore, and the replay
// socket fills it with the batches it missed.
func TestZMQCutShowsGap(t *testing.T) {
	rep, url := startZMQReplica(t, "tagged")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer func() { _ = sub.Close() }()
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(rep.KVEventsEndpoints().Endpoint); err != nil {
		t.Fatal(err)
	}
	got := make(chan wireMsg, 1024)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) == 3 && string(m.Frames[0]) == "kv" && len(m.Frames[1]) == 8 {
				got <- wireMsg{int64(binary.BigEndian.Uint64(m.Frames[1])), m.Frames[2]}
			}
		}
	}()
	next := func(wait time.Duration) (wireMsg, bool) {
		select {
		case m := <-got:
			return m, true
		case <-time.After(wait):
			return wireMsg{}, false
		}
	}
	// Until the subscription is through, messages are lost: send requests
	// until one arrives.
	last := int64(-1)
	for i := 0; last < 0; i++ {
		if i == 100 {
			t.Fatal("no message reached the subscriber")
		}
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("join", i), 100), "max_tokens": 2})
		if m, ok := next(100 * time.Millisecond); ok {
			last = m.seq
		}
	}
	flushEvents(t, rep)
	rep.CutKVEvents()
	complete(t, url, map[string]any{"prompt": prompt("during the cut", 100), "max_tokens": 2})
	flushEvents(t, rep)
	rep.RestoreKVEvents()
	complete(t, url, map[string]any{"prompt": prompt("after the cut", 100), "max_tokens": 2})
	var before, gapAt int64
	for gapAt == 0 {
		m, ok := next(10 * time.Second)
		if !ok {
			t.Fatal("no message after the restore")
		}
		if m.seq != last+1 {
			if m.seq <= last+1 {
				t.Fatalf("sequence %d after %d", m.seq, last)
			}
			before, gapAt = last, m.seq
		}
		last = m.seq
	}
	missed := replay(t, rep, before+1)
	if len(missed) == 0 || missed[0].seq != before+1 {
		t.Fatalf("replay from %d starts with %v", before+1, missed)
	}
	var during []wireMsg
	for _, m := range missed {
		if m.seq < gapAt {
			during = append(during, m)
		}
	}
	withheld := decoded(t, rep.cfg.BlockSize, during)
	keys := blockKeys([]byte(prompt("during the cut", 100)), rep.cfg.BlockSize)
	var stored []uint64
	for _, b := range withheld {
		for _, e := range b.events {
			if e.kind == blockStored && e.medium == mediumGPU {
				stored = append(stored, e.keys...)
			}
		}
	}
	if !slices.Contains(stored, keys[0]) || !slices.Contains(stored, keys[len(keys)-1]) {
		t.Fatalf("the replay before sequence %d does not carry the blocks stored during the cut", gapAt)
	}
}

// followed is a kvevents.Handler that keeps what a subscription delivers.
type followed struct {
	mu      sync.Mutex
	batches []kvevents.Batch
	resets  int
}

func (f *followed) Apply(b kvevents.Batch) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.batches = append(f.batches, b)
}

func (f *followed) resetCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.resets
}

func (f *followed) Reset(string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resets++
	f.batches = nil
}

// model plays what was delivered since the last reset.
func (f *followed) model(t *testing.T, bs int) cacheModel {
	t.Helper()
	f.mu.Lock()
	msgs := make([]wireMsg, len(f.batches))
	for i, b := range f.batches {
		p, err := kvevents.Encode(b, kvevents.Tagged)
		if err != nil {
			t.Fatal(err)
		}
		msgs[i] = wireMsg{int64(i), p}
	}
	f.mu.Unlock()
	m := cacheModel{}
	m.apply(t, bs, decoded(t, bs, msgs))
	return m
}

// follow subscribes to rep's events with kvevents' subscriber, sending
// requests to url until one batch is delivered: a batch reaches the
// subscriber only once it is connected, and the first one makes it replay
// what came before.
func follow(t *testing.T, rep *Replica, url string) (*kvevents.Subscriber, *followed) {
	t.Helper()
	ep := rep.KVEventsEndpoints()
	h := &followed{}
	sub, err := kvevents.Subscribe(t.Context(), kvevents.SubOptions{
		Endpoint: ep.Endpoint, ReplayEndpoint: ep.ReplayEndpoint, Topic: ep.Topic, Handler: h,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; sub.Status().Batches == 0; i++ {
		if i == 100 {
			t.Fatal("nothing delivered")
		}
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("join", i), 60), "max_tokens": 2})
		time.Sleep(20 * time.Millisecond)
	}
	return sub, h
}

// converged reports whether what h was delivered rebuilds the GPU keys
// rep holds.
func converged(t *testing.T, rep *Replica, h *followed) func() bool {
	return func() bool {
		return sameKeys(h.model(t, rep.cfg.BlockSize)[mediumGPU], heldKeys(rep)[mediumGPU])
	}
}

// TestSubscriberFollowsReplica: kvroute's subscriber, following a replica
// through evictions, a cut of the stream and a reset, ends up with the
// keys the replica holds, having filled the gap by replay.
func TestSubscriberFollowsReplica(t *testing.T) {
	rep, url := startZMQReplica(t, "positional")
	sub, h := follow(t, rep, url)
	for i := range 6 {
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("sub", i), 200), "max_tokens": 2})
	}
	waitFor(t, converged(t, rep, h))
	rep.CutKVEvents()
	for i := range 3 {
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("cut", i), 200), "max_tokens": 2})
	}
	flushEvents(t, rep)
	rep.RestoreKVEvents()
	complete(t, url, map[string]any{"prompt": prompt("restored", 200), "max_tokens": 2})
	waitFor(t, converged(t, rep, h))
	if st := sub.Status(); st.Gaps == 0 || st.Replays == 0 || st.Resets != 0 || h.resets != 0 {
		t.Fatalf("status %+v, handler resets %d", st, h.resets)
	}
	if !rep.ResetPrefixCache() {
		t.Fatal("reset refused")
	}
	waitFor(t, func() bool { return len(h.model(t, rep.cfg.BlockSize)[mediumGPU]) == 0 && sub.Status().Events > 0 })
}

// TestSubscriberFollowsRestart: after RestartKVEvents the replica's cache
// is empty and its sequence starts again at 0 on the same endpoints; the
// subscriber drops what it knew and follows the new stream.
func TestSubscriberFollowsRestart(t *testing.T) {
	rep, url := startZMQReplica(t, "tagged")
	ep := rep.KVEventsEndpoints()
	sub, h := follow(t, rep, url)
	for i := range 3 {
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("old", i), 200), "max_tokens": 2})
	}
	waitFor(t, converged(t, rep, h))
	if err := rep.RestartKVEvents(); err != nil {
		t.Fatal(err)
	}
	if st := rep.Stats(); st.CachedBlocks != 0 || rep.KVEventsEndpoints() != ep {
		t.Fatalf("after the restart: %d cached blocks, endpoints %+v", st.CachedBlocks, rep.KVEventsEndpoints())
	}
	if msgs := replay(t, rep, 0); len(msgs) != 0 {
		t.Fatalf("the restarted publisher replays %d batches", len(msgs))
	}
	for i := 0; h.resetCount() == 0; i++ {
		if i == 200 {
			t.Fatalf("the subscriber did not see the restart: %+v", sub.Status())
		}
		complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("new", i), 60), "max_tokens": 2})
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, converged(t, rep, h))
	if msgs := replay(t, rep, 0); len(msgs) == 0 || msgs[0].seq != 0 {
		t.Fatal("the restarted stream does not start at sequence 0")
	}
}
