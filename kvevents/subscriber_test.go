package kvevents

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap/zaptest"
)

// recorder is a Handler that logs what it is given: "b<ts>" for a batch,
// "reset" for a Reset.
type recorder struct {
	mu      sync.Mutex
	log     []string
	batches []Batch
	reasons []string
}

func (r *recorder) Apply(b Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, fmt.Sprintf("b%g", b.TS))
	r.batches = append(r.batches, b)
}

func (r *recorder) Reset(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, "reset")
	r.reasons = append(r.reasons, reason)
}

func (r *recorder) snapshot() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

// since is the log after its first n entries.
func (r *recorder) since(n int) []string { return r.snapshot()[n:] }

func newPub(t *testing.T, o PubOptions) *Publisher {
	t.Helper()
	if o.Endpoint == "" {
		o.Endpoint = "tcp://127.0.0.1:0"
	}
	p, err := NewPublisher(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// subscribe follows p's addresses (or o's, when set) with a recorder and
// fast backoff; the subscription ends with the test, which checks it stops.
func subscribe(t *testing.T, p *Publisher, o SubOptions) (*Subscriber, *recorder) {
	t.Helper()
	h := &recorder{}
	if o.Endpoint == "" {
		o.Endpoint = p.Addr()
	}
	if o.ReplayEndpoint == "" && p != nil {
		o.ReplayEndpoint = p.ReplayAddr()
	}
	o.Handler = h
	o.Logger = zaptest.NewLogger(t)
	o.MinBackoff, o.MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Subscribe(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Error("the subscription did not stop when its context ended")
		}
	})
	return s, h
}

// batch is a batch told apart by its timestamp.
func batch(ts float64, evs ...Event) Batch { return Batch{TS: ts, Events: evs} }

// warmUp publishes batches 1, 2, ... until the subscriber has delivered one,
// so that the test proper starts on an established subscription (a SUB
// socket misses what is published before its subscription reaches the
// publisher). It returns the next timestamp to use.
func warmUp(t *testing.T, p *Publisher, s *Subscriber) float64 {
	t.Helper()
	ts := 1.0
	wait.For(t, 10*time.Second, "a first batch", func() bool {
		if s.Status().Batches > 0 {
			return true
		}
		if err := p.Publish(batch(ts)); err != nil {
			t.Fatal(err)
		}
		ts++
		time.Sleep(5 * time.Millisecond)
		return false
	})
	// Let the batches still in flight arrive.
	wait.For(t, 10*time.Second, "the warm-up batches", func() bool { return s.Status().Seq == int64(ts)-2 })
	return ts
}

func publish(t *testing.T, p *Publisher, withhold bool, ts ...float64) {
	t.Helper()
	for _, x := range ts {
		f := p.Publish
		if withhold {
			f = p.Withhold
		}
		if err := f(batch(x)); err != nil {
			t.Fatal(err)
		}
	}
}

// A first subscription without a replay endpoint starts at whatever batch
// reaches it first: what the engine published before is not a loss of
// state kvroute had, so nothing is reset or logged as missed.
func TestFirstSubscriptionWithoutReplayIsNoReset(t *testing.T) {
	p := newPub(t, PubOptions{Topic: "kv-events"})
	s, h := subscribe(t, p, SubOptions{Topic: "kv-events"})
	publish(t, p, false, 1, 2, 3) // before the subscription reaches the publisher: missed
	ts := 4.0
	wait.For(t, 10*time.Second, "a first batch", func() bool {
		if s.Status().Batches > 0 {
			return true
		}
		publish(t, p, false, ts)
		ts++
		time.Sleep(5 * time.Millisecond)
		return false
	})
	if st := s.Status(); st.Resets != 0 || st.Gaps != 0 || st.Batches == 0 {
		t.Fatalf("status %+v, want batches and no reset or gap", st)
	}
	if slices.Contains(h.snapshot(), "reset") {
		t.Fatalf("the handler was reset: %v", h.reasons)
	}
}

func TestLiveDelivery(t *testing.T) {
	start := time.Now()
	p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv-events"})
	s, h := subscribe(t, p, SubOptions{Topic: "kv-events"})
	wait.For(t, 10*time.Second, "live", func() bool { return s.Status().Live })
	// Whatever the SUB socket missed at the start, replay fills in:
	// batches 0.. arrive in order and none is lost.
	want := make([]string, 0, 50)
	for i := range 50 {
		stored := BlockStored{BlockHashes: []uint64{uint64(i)}, TokenIDs: []uint32{1, 2}, BlockSize: 2}
		if err := p.Publish(batch(float64(i), stored, AllBlocksCleared{})); err != nil {
			t.Fatal(err)
		}
		want = append(want, fmt.Sprintf("b%d", i))
	}
	wait.For(t, 10*time.Second, "50 batches", func() bool { return s.Status().Batches == 50 })
	if got := h.snapshot(); !slices.Equal(got, want) {
		t.Fatalf("handler saw %v, want %v", got, want)
	}
	st := s.Status()
	if !st.Live || st.Seq != 49 || st.Events != 100 || st.Resets != 0 || st.Gaps != 0 || st.Connects != 1 {
		t.Fatalf("status %+v", st)
	}
	if st.LastMessage.Before(start) {
		t.Fatalf("last message at %v", st.LastMessage)
	}
	if got := h.batches[7].Events[0].(BlockStored).BlockHashes[0]; got != 7 {
		t.Fatalf("batch 7 stored hash %d", got)
	}
}

func TestGapFilledByReplay(t *testing.T) {
	for _, enc := range []Encoding{Tagged, Positional} {
		t.Run(enc.String(), func(t *testing.T) {
			p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0", Encoding: enc})
			s, h := subscribe(t, p, SubOptions{})
			ts := warmUp(t, p, s)
			n, before := len(h.snapshot()), s.Status()
			publish(t, p, true, ts, ts+1) // missed by the subscriber
			publish(t, p, false, ts+2)
			wait.For(t, 10*time.Second, "the batch after the gap", func() bool { return s.Status().Batches == before.Batches+3 })
			want := []string{fmt.Sprintf("b%g", ts), fmt.Sprintf("b%g", ts+1), fmt.Sprintf("b%g", ts+2)}
			if got := h.since(n); !slices.Equal(got, want) {
				t.Fatalf("after the gap the handler saw %v, want %v", got, want)
			}
			st := s.Status()
			if st.Gaps != before.Gaps+1 || st.Replays != before.Replays+1 || st.Resets != before.Resets {
				t.Fatalf("status before %+v, after %+v", before, st)
			}
		})
	}
}

func TestReplayCannotReachBack(t *testing.T) {
	p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0", Keep: 2})
	s, h := subscribe(t, p, SubOptions{})
	ts := warmUp(t, p, s)
	n := len(h.snapshot())
	publish(t, p, true, ts, ts+1, ts+2) // only the last is still kept ...
	publish(t, p, false, ts+3)          // ... once this one is
	wait.For(t, 10*time.Second, "the batch after the gap", func() bool { return s.Status().Seq == int64(ts)+2 })
	want := []string{"reset", fmt.Sprintf("b%g", ts+2), fmt.Sprintf("b%g", ts+3)}
	if got := h.since(n); !slices.Equal(got, want) {
		t.Fatalf("after the gap the handler saw %v, want %v", got, want)
	}
	if r := h.reasons[len(h.reasons)-1]; !strings.Contains(r, "replay starts at") {
		t.Fatalf("reset because %q", r)
	}
}

// TestGapThatReplayCannotFill: without a replay endpoint, with one that is
// not there and with one that never answers (ReplayTimeout), a gap is a
// Reset, and the subscription goes on.
func TestGapThatReplayCannotFill(t *testing.T) {
	mute := zmq4.NewRouter(context.Background(), zmq4.WithLogger(quietLog))
	if err := mute.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = mute.Close() }()
	for _, c := range []struct {
		name, replay string
		replays      uint64
	}{
		{"no replay endpoint", "", 0},
		{"nothing listening", "tcp://127.0.0.1:1", 1},
		{"no answer", tcpAddr(mute), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPub(t, PubOptions{})
			s, h := subscribe(t, p, SubOptions{ReplayEndpoint: c.replay, ReplayTimeout: 100 * time.Millisecond})
			ts := warmUp(t, p, s)
			n, before := len(h.snapshot()), s.Status()
			publish(t, p, true, ts)
			publish(t, p, false, ts+1)
			wait.For(t, 10*time.Second, "the batch after the gap", func() bool { return s.Status().Batches == before.Batches+1 })
			if got, want := h.since(n), []string{"reset", fmt.Sprintf("b%g", ts+1)}; !slices.Equal(got, want) {
				t.Fatalf("after the gap the handler saw %v, want %v", got, want)
			}
			if st := s.Status(); st.Replays != before.Replays+c.replays || st.Gaps != before.Gaps+1 {
				t.Fatalf("status before %+v, after %+v", before, st)
			}
		})
	}
}

// restarted publishes batches base, base+1, ... on p (whose sequence 0 is
// base) until s has restarted and delivered them all, then checks that the
// handler, after its first n entries, saw a Reset and then every batch from
// base on, in order.
func restarted(t *testing.T, p *Publisher, s *Subscriber, h *recorder, n int, base, next float64) {
	t.Helper()
	before := s.Status()
	wait.For(t, 10*time.Second, "batches of the restarted engine", func() bool {
		publish(t, p, false, next)
		next++
		time.Sleep(5 * time.Millisecond)
		st := s.Status()
		return st.Restarts > before.Restarts && st.Seq == int64(next-base)-1
	})
	got := h.since(n)
	if len(got) < 2 || got[0] != "reset" {
		t.Fatalf("after the restart the handler saw %v, want a reset first", got)
	}
	for i, e := range got[1:] {
		if want := fmt.Sprintf("b%g", base+float64(i)); e != want {
			t.Fatalf("after the restart the handler saw %v, want b%g, b%g, ... after the reset", got, base, base+1)
		}
	}
}

func TestPublisherRestart(t *testing.T) {
	p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0"})
	s, h := subscribe(t, p, SubOptions{})
	ts := warmUp(t, p, s)
	publish(t, p, false, ts, ts+1, ts+2)
	wait.For(t, 10*time.Second, "three more batches", func() bool { return s.Status().Seq == int64(ts)+1 })
	n, before := len(h.snapshot()), s.Status()

	// The engine restarts on the same ports; its sequence starts at 0.
	addr, replay := p.Addr(), p.ReplayAddr()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the subscriber to see the publisher go", func() bool { return !s.Status().Live })
	p2 := newPub(t, PubOptions{Endpoint: addr, ReplayEndpoint: replay})
	restarted(t, p2, s, h, n, 100, 100)
	if st := s.Status(); st.Connects != before.Connects+1 {
		t.Fatalf("connects %d, want %d", st.Connects, before.Connects+1)
	}
}

// TestRestartBehindReconnect: an engine that restarted and had already
// counted past where the subscriber stopped before the subscriber is back
// is told apart by the batch the replay returns for the last sequence
// delivered.
func TestRestartBehindReconnect(t *testing.T) {
	p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0"})
	s, h := subscribe(t, p, SubOptions{})
	ts := warmUp(t, p, s)
	last := int64(ts) - 2 // the last sequence delivered
	addr, replay := p.Addr(), p.ReplayAddr()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the subscriber to see the publisher go", func() bool { return !s.Status().Live })
	n, before := len(h.snapshot()), s.Status()
	p2 := newPub(t, PubOptions{Endpoint: addr, ReplayEndpoint: replay})
	for i := range last + 1 { // sequences 0..last, other batches than before
		publish(t, p2, true, float64(200+i))
	}
	restarted(t, p2, s, h, n, 200, float64(200+last+1))
	if r := h.reasons[len(h.reasons)-1]; !strings.Contains(r, "differs") {
		t.Fatalf("reset because %q", r)
	}
	if st := s.Status(); st.Restarts != before.Restarts+1 || st.Replays != before.Replays+2 {
		t.Fatalf("status before %+v, after %+v", before, st)
	}
}

func TestHybridGroupsAndClears(t *testing.T) {
	p := newPub(t, PubOptions{ReplayEndpoint: "tcp://127.0.0.1:0", Encoding: Positional})
	s, h := subscribe(t, p, SubOptions{})
	ts := warmUp(t, p, s)
	// A hybrid model's step: one BlockStored per cache group, then a clear.
	full := BlockStored{BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2,
		GroupIdx: 0, SpecKind: "full_attention", Medium: "GPU"}
	mamba := full
	mamba.GroupIdx, mamba.SpecKind = 1, "mamba"
	window := full
	window.GroupIdx, window.SpecKind = 2, "sliding_window"
	ragged := full // a group whose span is not its blocks
	ragged.GroupIdx, ragged.TokenIDs = 3, []uint32{1, 2, 3}
	if err := p.Publish(batch(ts, full, mamba, window, ragged, AllBlocksCleared{})); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the hybrid batch", func() bool { return s.Status().Seq == int64(ts)-1 })
	h.mu.Lock()
	got := h.batches[len(h.batches)-1]
	h.mu.Unlock()
	var indexed []int
	for _, ev := range got.Events {
		if st, ok := ev.(BlockStored); ok && Indexable(st) {
			indexed = append(indexed, st.GroupIdx)
		}
	}
	if !slices.Equal(indexed, []int{0}) {
		t.Fatalf("indexed groups %v, want [0]", indexed)
	}
	if len(got.Events) != 5 || got.Events[4] != (AllBlocksCleared{}) {
		t.Fatalf("events %#v, want the four stores and a clear", got.Events)
	}
}

// TestMalformedMessages: messages that are not [topic, sequence, payload]
// and payloads that are not batches are counted; a lost batch is a Reset.
func TestMalformedMessages(t *testing.T) {
	raw := zmq4.NewPub(context.Background(), zmq4.WithLogger(quietLog))
	if err := raw.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	s, h := subscribe(t, nil, SubOptions{Endpoint: tcpAddr(raw), ReplayEndpoint: "tcp://127.0.0.1:1"})
	good := func(seq int64, ts float64) {
		p, err := Encode(batch(ts), Tagged)
		if err != nil {
			t.Fatal(err)
		}
		if err := raw.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(seq), p)); err != nil {
			t.Fatal(err)
		}
	}
	seq := int64(0)
	wait.For(t, 10*time.Second, "a first batch", func() bool {
		good(seq, 0)
		seq++
		time.Sleep(5 * time.Millisecond)
		return s.Status().Batches > 0
	})
	wait.For(t, 10*time.Second, "the warm-up batches", func() bool { return s.Status().Seq == seq-1 })
	n, before := len(h.snapshot()), s.Status()
	if err := raw.SendMulti(zmq4.NewMsgFrom(nil, []byte{1, 2})); err != nil {
		t.Fatal(err)
	}
	if err := raw.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(seq), []byte("garbage"))); err != nil {
		t.Fatal(err)
	}
	good(seq+1, 42)
	wait.For(t, 10*time.Second, "the good batch", func() bool { return s.Status().Seq == seq+1 })
	if got, want := h.since(n), []string{"reset", "b42"}; !slices.Equal(got, want) {
		t.Fatalf("the handler saw %v, want %v", got, want)
	}
	if st := s.Status(); st.DecodeErrors != before.DecodeErrors+2 || st.Gaps != before.Gaps {
		t.Fatalf("status before %+v, after %+v", before, st)
	}
}

// TestUnreachableEndpoint: with nothing listening the subscription keeps
// retrying, is not live, and stops with its context.
func TestUnreachableEndpoint(t *testing.T) {
	s, h := subscribe(t, nil, SubOptions{Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://127.0.0.1:1"})
	time.Sleep(50 * time.Millisecond)
	if st := s.Status(); st.Live || st.Connects != 0 || st.Batches != 0 {
		t.Fatalf("status %+v", st)
	}
	if got := h.snapshot(); len(got) != 0 {
		t.Fatalf("handler saw %v", got)
	}
}

func TestOptionsChecked(t *testing.T) {
	if _, err := Subscribe(context.Background(), SubOptions{Handler: &recorder{}}); err == nil {
		t.Error("Subscribe without an endpoint")
	}
	if _, err := Subscribe(context.Background(), SubOptions{Endpoint: "tcp://127.0.0.1:1"}); err == nil {
		t.Error("Subscribe without a handler")
	}
	if _, err := NewPublisher(PubOptions{}); err == nil {
		t.Error("NewPublisher without an endpoint")
	}
	if _, err := NewPublisher(PubOptions{Endpoint: "bogus"}); err == nil {
		t.Error("NewPublisher on a bogus endpoint")
	}
	p := newPub(t, PubOptions{})
	if p.ReplayAddr() != "" || !strings.HasPrefix(p.Addr(), "tcp://127.0.0.1:") {
		t.Errorf("addresses %q, %q", p.Addr(), p.ReplayAddr())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(batch(1)); err == nil {
		t.Error("Publish after Close")
	}
}

func TestRankEndpoint(t *testing.T) {
	for _, c := range []struct {
		in   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 3, "tcp://*:5560"},
		{"tcp://10.0.0.5:5557", 1, "tcp://10.0.0.5:5558"},
		{"tcp://[::1]:5557", 2, "tcp://[::1]:5559"},
		{"inproc://cache", 2, "inproc://cache_dp2"},
		{"tcp://host", 1, ""},
		{"tcp://host:x", 1, ""},
		{"tcp://host:65535", 1, ""},
		{"ipc:///tmp/kv", 1, ""},
		{"tcp://*:5557", -1, ""},
	} {
		got, err := RankEndpoint(c.in, c.rank)
		if got != c.want || (err != nil) != (c.want == "") {
			t.Errorf("RankEndpoint(%q, %d) = %q, %v; want %q", c.in, c.rank, got, err, c.want)
		}
	}
}

// replayFrames reads every engine's replay replies, with or without the
// envelope's delimiter: SGLang's and earlier vLLM's [sequence, payload],
// vLLM's [topic, sequence, payload], the end markers of each.
func TestReplayFrames(t *testing.T) {
	seq := []byte{0, 0, 0, 0, 0, 0, 0, 7}
	payload, topic, empty := []byte("batch"), []byte("kv-events"), []byte{}
	cases := []struct {
		name   string
		frames [][]byte
		want   [][]byte // nil: malformed
	}{
		{"sequence and payload", [][]byte{seq, payload}, [][]byte{seq, payload}},
		{"after the delimiter", [][]byte{empty, seq, payload}, [][]byte{seq, payload}},
		{"with vLLM's topic", [][]byte{topic, seq, payload}, [][]byte{seq, payload}},
		{"delimiter and topic", [][]byte{empty, topic, seq, payload}, [][]byte{seq, payload}},
		{"SGLang's end", [][]byte{endSeq, empty}, [][]byte{endSeq, empty}},
		{"vLLM's end after the delimiter", [][]byte{empty, empty, endSeq, empty}, [][]byte{endSeq, empty}},
		{"vLLM's end, delimiter stripped", [][]byte{empty, endSeq, empty}, [][]byte{endSeq, empty}},
		{"an early vLLM's empty end", [][]byte{empty, empty}, [][]byte{endSeq, nil}},
		{"a short sequence", [][]byte{{1, 2}, payload}, nil},
		{"one frame", [][]byte{seq}, nil},
		{"five frames", [][]byte{empty, topic, seq, payload, payload}, nil},
	}
	for _, c := range cases {
		got, ok := replayFrames(c.frames)
		if ok != (c.want != nil) || ok && (!bytes.Equal(got[0], c.want[0]) || !bytes.Equal(got[1], c.want[1])) {
			t.Errorf("%s: %q %v, want %q", c.name, got, ok, c.want)
		}
	}
}
