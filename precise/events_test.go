package precise

import (
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/tokenize"
)

const (
	evTestBlock = 16
	evTestModel = "m"
)

// evTestFleet builds n replicas serving evTestModel on 127.0.0.1 URLs that
// are never contacted (the fleet is not started).
func evTestFleet(t testing.TB, n int) []*backends.Replica {
	t.Helper()
	specs := make([]backends.Spec, n)
	for i := range specs {
		specs[i] = backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 21000+i),
			Engine: backends.EngineVLLM, Models: []string{evTestModel}}
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f.Replicas()
}

func evTestIndex() *index.Index {
	return index.New(index.Options{KeyBlock: evTestBlock, DefaultBudget: 1 << 24, MaxBytes: 256 << 20})
}

// evTestState is one replica's block state over a fresh Index.
func evTestState(t testing.TB, maxBlocks int) (*evState, *index.Index, []*backends.Replica) {
	t.Helper()
	ix := evTestIndex()
	reps := evTestFleet(t, 2)
	return newEvState(ix, reps[0], evFirstModel, evTestBlock, maxBlocks, &evCounters{}), ix, reps
}

// evHeld is how many leading tokens of the exact key rep holds in ix.
func evHeld(ix *index.Index, key []uint32, rep *backends.Replica) int {
	v := ix.View(time.Now())
	for _, m := range v.Match(nil, key, true) {
		if int(m.Replica) == rep.ID() {
			return m.Tokens
		}
	}
	return 0
}

// evHeldAll is how many tokens rep holds in ix's exact share.
func evHeldAll(ix *index.Index, rep *backends.Replica) int64 {
	return ix.Stats().HeldExact[rep.ID()]
}

// evToks returns n token ids derived from seed.
func evToks(seed uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*1_000_003 + uint32(i)*7 //nolint:gosec // test data
	}
	return out
}

func evKey(model string, toks []uint32) []uint32 {
	return tokenize.AppendExactKey(nil, model, toks, evTestBlock)
}

// evRun is a BlockStored of toks in blocks of bs tokens, hashed first,
// first+1, ... and chained to parent (0 for none).
func evRun(first, parent uint64, toks []uint32, bs int) kvevents.BlockStored {
	ev := kvevents.BlockStored{ParentHash: parent, HasParent: parent != 0, TokenIDs: toks, BlockSize: bs, Medium: "GPU"}
	for i := range len(toks) / bs {
		ev.BlockHashes = append(ev.BlockHashes, first+uint64(i)) //nolint:gosec // i >= 0
	}
	return ev
}

func evApply(s *evState, evs ...kvevents.Event) {
	s.apply(kvevents.Batch{Events: evs}, time.Now())
}

// TestEventsStoredKeys: stored runs, chained to their parents, put into the
// Index exactly the keys AppendExactKey gives the blocks' tokens, under the
// replica's model or the event's LoRA adapter.
func TestEventsStoredKeys(t *testing.T) {
	s, ix, reps := evTestState(t, 0)
	s.max = DefaultMaxBlocks
	a := evToks(1, 5*evTestBlock)
	b := append(append([]uint32(nil), a[:3*evTestBlock]...), evToks(2, 2*evTestBlock)...)
	evApply(s, evRun(100, 0, a[:2*evTestBlock], evTestBlock))
	evApply(s, evRun(102, 101, a[2*evTestBlock:], evTestBlock), evRun(200, 102, b[3*evTestBlock:], evTestBlock))
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != len(a) {
		t.Fatalf("conversation a: %d tokens held, want %d", got, len(a))
	}
	if got := evHeld(ix, evKey(evTestModel, b), reps[0]); got != len(b) {
		t.Fatalf("branch b: %d tokens held, want %d", got, len(b))
	}
	if got := evHeldAll(ix, reps[0]); got != 7*evTestBlock {
		t.Fatalf("replica holds %d tokens, want the 7 distinct blocks", got)
	}
	if evHeld(ix, evKey(evTestModel, a), reps[1]) != 0 || evHeld(ix, evKey("other", a), reps[0]) != 0 {
		t.Fatal("held by the wrong replica or under another model")
	}
	lora := evRun(300, 0, evToks(3, 2*evTestBlock), evTestBlock)
	lora.LoraName = "adapter"
	evApply(s, lora)
	if evHeld(ix, evKey("adapter", lora.TokenIDs), reps[0]) != 2*evTestBlock || evHeld(ix, evKey(evTestModel, lora.TokenIDs), reps[0]) != 0 {
		t.Fatal("a LoRA run is not keyed under its adapter")
	}
	if s.c.stored.Load() != 9 || s.used() != 9 || ix.Writes(index.SourceEngine) == 0 {
		t.Fatalf("stored %d, kept %d, engine writes %d", s.c.stored.Load(), s.used(), ix.Writes(index.SourceEngine))
	}
}

// TestEventsRemoved: a removed block takes its value and everything past
// it out of the Index; a block stored on two media stays until both remove
// it; removals of unknown blocks are counted.
func TestEventsRemoved(t *testing.T) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	a := evToks(1, 6*evTestBlock)
	evApply(s, evRun(1, 0, a, evTestBlock))
	cpu := evRun(3, 2, a[3*evTestBlock:], evTestBlock) // blocks 3.. also in the CPU tier
	cpu.Medium = "CPU"
	evApply(s, cpu)
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{5}, Medium: "GPU"})
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != len(a) {
		t.Fatalf("after a GPU removal of a block the CPU tier holds: %d tokens held", got)
	}
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{5, 999}, Medium: "CPU"})
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != 4*evTestBlock {
		t.Fatalf("after block 5 is gone: %d tokens held, want 4 blocks", got)
	}
	// Block 6 (the last) is still held by the engine but unreachable.
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{2}, Medium: "GPU"})
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != evTestBlock {
		t.Fatalf("after block 2 is gone: %d tokens held, want 1 block", got)
	}
	if got := evHeldAll(ix, reps[0]); got != evTestBlock {
		t.Fatalf("the replica holds %d tokens in all", got)
	}
	// A run stored under block 6 chains, but is not placed past the
	// blocks the engine removed: it cannot hit them.
	tail := evToks(9, evTestBlock)
	evApply(s, evRun(7, 6, tail, evTestBlock))
	if got := evHeld(ix, evKey(evTestModel, append(append([]uint32(nil), a...), tail...)), reps[0]); got != evTestBlock {
		t.Fatalf("a run under an unreachable block: %d tokens held from the root", got)
	}
	if _, ok := s.byHash[7]; !ok {
		t.Fatal("the run under an unreachable block is not kept")
	}
	if s.c.removed.Load() != 3 || s.c.unknownRemoved.Load() != 1 {
		t.Fatalf("removed %d, unknown %d", s.c.removed.Load(), s.c.unknownRemoved.Load())
	}
	// Removing everything frees every slot.
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{1, 3, 4, 6, 7}},
		kvevents.BlockRemoved{BlockHashes: []uint64{3, 4, 6}, Medium: "CPU"})
	if s.used() != 0 || len(s.byHash) != 0 || evHeldAll(ix, reps[0]) != 0 {
		t.Fatalf("after every removal: %d slots used, %d hashes, %d tokens held", s.used(), len(s.byHash), evHeldAll(ix, reps[0]))
	}
}

// TestEventsCleared: AllBlocksCleared takes out every engine entry of the
// replica, and nothing the router placed elsewhere or other replicas hold.
func TestEventsCleared(t *testing.T) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	other := newEvState(ix, reps[1], evFirstModel, evTestBlock, DefaultMaxBlocks, &evCounters{})
	a, b := evToks(1, 4*evTestBlock), evToks(2, 3*evTestBlock)
	evApply(s, evRun(1, 0, a, evTestBlock), evRun(10, 0, b, evTestBlock))
	evApply(other, evRun(1, 0, a, evTestBlock))
	approx := []uint32{7, 8, 9}
	ix.RouterWriter().Place(approx, false, reps[0], time.Now())
	evApply(s, kvevents.AllBlocksCleared{})
	if evHeld(ix, evKey(evTestModel, a), reps[0]) != 0 || evHeld(ix, evKey(evTestModel, b), reps[0]) != 0 {
		t.Fatal("engine entries left after AllBlocksCleared")
	}
	if ix.Stats().Held[reps[0].ID()] != int64(len(approx)*evTestBlock) || evHeld(ix, evKey(evTestModel, a), reps[1]) != len(a) {
		t.Fatal("AllBlocksCleared took entries that were not the replica's engine entries")
	}
	if s.used() != 0 || s.c.clears.Load() != 1 {
		t.Fatalf("%d slots used, %d clears", s.used(), s.c.clears.Load())
	}
	evApply(s, evRun(20, 1, b, evTestBlock)) // its parent went with the clear
	if s.c.unplaceable.Load() != 3 || evHeldAll(ix, reps[0]) != 0 {
		t.Fatalf("a run chained to a cleared block: unplaceable %d", s.c.unplaceable.Load())
	}
}

// TestEventsSkipped: Mamba and sliding-window groups, and spans whose
// tokens are not their blocks, are not indexed; removals in those groups
// leave the attention group's blocks of the same hashes alone; a run whose
// parent is unknown is left out, and so are the runs chained to it.
func TestEventsSkipped(t *testing.T) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	a := evToks(1, 3*evTestBlock)
	attn := evRun(1, 0, a, evTestBlock)
	attn.SpecKind = "full_attention"
	mamba := evRun(1, 0, a[:evTestBlock], evTestBlock)
	mamba.GroupIdx, mamba.SpecKind = 1, "mamba"
	sliding := evRun(1, 0, a, evTestBlock)
	sliding.GroupIdx, sliding.SpecKind = 2, "sliding_window"
	bad := evRun(50, 0, evToks(5, 2*evTestBlock), evTestBlock)
	bad.TokenIDs = bad.TokenIDs[:evTestBlock+3]
	evApply(s, attn, mamba, sliding, bad)
	if s.c.skipped.Load() != 1+3+2 || s.used() != 3 {
		t.Fatalf("skipped %d blocks, kept %d", s.c.skipped.Load(), s.used())
	}
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{1, 2}, GroupIdx: 2}, kvevents.BlockRemoved{BlockHashes: []uint64{1}, GroupIdx: 1})
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != len(a) {
		t.Fatalf("removals of other groups took attention blocks: %d tokens held", got)
	}
	orphan, child := evRun(60, 59, evToks(6, 2*evTestBlock), evTestBlock), evRun(62, 61, evToks(7, evTestBlock), evTestBlock)
	evApply(s, orphan, child)
	if s.c.unplaceable.Load() != 3 || s.used() != 3 || evHeldAll(ix, reps[0]) != int64(len(a)) {
		t.Fatalf("unplaceable %d, kept %d, held %d", s.c.unplaceable.Load(), s.used(), evHeldAll(ix, reps[0]))
	}
	evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{2}})
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != evTestBlock {
		t.Fatalf("an attention-group removal: %d tokens held", got)
	}
}

// TestEventsBlockSizes: engine blocks smaller than, larger than, or not
// dividing the key block give the key of the whole token stream, a key
// value held once the block of its last token is; removing a block takes
// the value its first token belongs to and all after it.
func TestEventsBlockSizes(t *testing.T) {
	for _, bs := range []int{1, 4, 8, 16, 24, 32, 48, 5} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			s, ix, reps := evTestState(t, DefaultMaxBlocks)
			n := 12 // engine blocks per run
			a := evToks(1, 2*n*bs)
			b := append(append([]uint32(nil), a[:n*bs]...), evToks(2, n*bs)...)
			evApply(s, evRun(1, 0, a[:n*bs], bs))
			evApply(s, evRun(uint64(n+1), uint64(n), a[n*bs:], bs))  //nolint:gosec // small
			evApply(s, evRun(uint64(10*n), uint64(n), b[n*bs:], bs)) //nolint:gosec // small
			wantA := len(a) / evTestBlock * evTestBlock
			if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != wantA {
				t.Fatalf("a: %d tokens held, want %d", got, wantA)
			}
			if got := evHeld(ix, evKey(evTestModel, b), reps[0]); got != len(b)/evTestBlock*evTestBlock {
				t.Fatalf("b: %d tokens held", got)
			}
			// Remove engine block j of a (1-based hash j+1 is block j+1).
			for _, j := range []int{2*n - 1, n + 3, n, 5, 1} {
				evApply(s, kvevents.BlockRemoved{BlockHashes: []uint64{uint64(j + 1)}}) //nolint:gosec // small
				want := j * bs / evTestBlock * evTestBlock
				if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != want {
					t.Fatalf("after removing block %d: %d tokens of a held, want %d", j, got, want)
				}
			}
			evApply(s, kvevents.AllBlocksCleared{})
			if got := evHeldAll(ix, reps[0]); got != 0 || s.used() != 0 {
				t.Fatalf("after the clear: %d tokens held, %d slots", got, s.used())
			}
		})
	}
}

// TestEventsOverflow: past MaxBlocks the replica's state is dropped, its
// entries evicted, and the events that follow build it again.
func TestEventsOverflow(t *testing.T) {
	s, ix, reps := evTestState(t, 6)
	a, b := evToks(1, 4*evTestBlock), evToks(2, 4*evTestBlock)
	evApply(s, evRun(1, 0, a, evTestBlock))
	evApply(s, evRun(10, 0, b, evTestBlock))
	if s.c.overflows.Load() != 1 || s.used() != 0 || evHeldAll(ix, reps[0]) != 0 {
		t.Fatalf("overflows %d, %d slots, %d tokens held", s.c.overflows.Load(), s.used(), evHeldAll(ix, reps[0]))
	}
	evApply(s, evRun(10, 0, b, evTestBlock))
	if got := evHeld(ix, evKey(evTestModel, b), reps[0]); got != len(b) {
		t.Fatalf("after the overflow: %d tokens held", got)
	}
}

// BenchmarkEventsStored applies a batch of one BlockStored of 32 blocks,
// continuing a conversation of 64 blocks, and its removal.
func BenchmarkEventsStored(b *testing.B) {
	s, _, _ := evTestState(b, DefaultMaxBlocks)
	prefix := evToks(1, 64*evTestBlock)
	evApply(s, evRun(1, 0, prefix, evTestBlock))
	turn := evRun(1000, 64, evToks(2, 32*evTestBlock), evTestBlock)
	stored := kvevents.Batch{Events: []kvevents.Event{turn}}
	removed := kvevents.Batch{Events: []kvevents.Event{kvevents.BlockRemoved{BlockHashes: turn.BlockHashes}}}
	benchStoreRemove(b, s, stored, removed)
}

// TestEventsExtraKeys: a block the engine hashed with other inputs than
// its tokens and its salt (multimodal hashes) and the blocks after it are
// kept but not placed; a block whose only extra key is its LoRA adapter,
// and an adapter named only by number, are keyed apart from the base
// model.
func TestEventsExtraKeys(t *testing.T) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	a := evToks(1, 3*evTestBlock)
	mm := evRun(1, 0, a[:2*evTestBlock], evTestBlock)
	mm.ExtraKeys = [][]byte{evEnc(t, []any{[]any{"mm", "h1"}}), nil}
	evApply(s, mm, evRun(3, 2, a[2*evTestBlock:], evTestBlock))
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != 0 || s.used() != 3 || evHeldAll(ix, reps[0]) != 0 {
		t.Fatalf("multimodal run: %d tokens of the plain key held, %d kept", got, s.used())
	}
	lora := evRun(10, 0, a, evTestBlock)
	lora.LoraName = "ad"
	lora.ExtraKeys = [][]byte{evEnc(t, []any{"ad"}), evEnc(t, []any{"ad"}), evEnc(t, []any{"ad"})}
	byID := evRun(20, 0, a, evTestBlock)
	byID.LoraID = 7
	evApply(s, lora, byID)
	if got := evHeld(ix, evKey("ad", a), reps[0]); got != len(a) {
		t.Fatalf("LoRA run: %d tokens held under its adapter", got)
	}
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != 0 {
		t.Fatalf("an adapter's blocks match the base model's key: %d tokens", got)
	}
	if len(evWords([]byte{1, 2, 3})) != 2 || slices.Equal(evWords([]byte{1}), evWords([]byte{1, 0})) {
		t.Fatal("evWords packs different bytes alike")
	}
}

func evEnc(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEventsCacheSalt: a run whose first block carries a cache salt, in
// any of the forms the engines send, is placed under the salt's key
// (tokenize.SaltedName of its model or adapter), which a request of the
// same salt matches and one of another salt, or of none, does not; a
// salt beside other inputs, or on a later block, keeps the run unplaced.
func TestEventsCacheSalt(t *testing.T) {
	a := evToks(1, 3*evTestBlock)
	tests := []struct {
		name  string
		lora  string
		first []byte // the first block's extra keys
		later []byte // the second block's
		meta  string // SGLang's metadata cache_salt
		name2 string // the model or adapter the run is keyed under
		salt  string // its salt
		held  int    // tokens held under the salt's key, in blocks
	}{
		{name: "bare string", first: evEnc(t, []any{"s1"}), name2: evTestModel, salt: "s1", held: 3},
		{name: "tagged pair", first: evEnc(t, []any{[]any{"cache_salt", "s1"}}), name2: evTestModel, salt: "s1", held: 3},
		{name: "lone tagged pair", first: evEnc(t, []any{"cache_salt", "s1"}), name2: evTestModel, salt: "s1", held: 3},
		{name: "lora and salt, bare", lora: "ad", first: evEnc(t, []any{"ad", "s1"}), later: evEnc(t, []any{"ad"}), name2: "ad", salt: "s1", held: 3},
		{name: "lora and salt, tagged", lora: "ad", first: evEnc(t, []any{[]any{"lora", "ad"}, []any{"cache_salt", "s1"}}),
			later: evEnc(t, []any{[]any{"lora", "ad"}}), name2: "ad", salt: "s1", held: 3},
		{name: "SGLang metadata", meta: "s1", name2: evTestModel, salt: "s1", held: 3},
		{name: "salt and a multimodal input", first: evEnc(t, []any{[]any{"cache_salt", "s1"}, []any{"mm", "h"}}), name2: evTestModel},
		{name: "two bare strings", first: evEnc(t, []any{"s1", "h"}), name2: evTestModel},
		{name: "salt on a later block", later: evEnc(t, []any{"s1"}), name2: evTestModel, held: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, ix, reps := evTestState(t, DefaultMaxBlocks)
			run := evRun(1, 0, a, evTestBlock)
			run.LoraName, run.CacheSalt = tc.lora, tc.meta
			if tc.first != nil || tc.later != nil {
				run.ExtraKeys = [][]byte{tc.first, tc.later, tc.later}
			}
			evApply(s, run)
			got, want := evHeld(ix, evKey(tokenize.SaltedName(tc.name2, tc.salt), a), reps[0]), tc.held*evTestBlock
			if got != want {
				t.Errorf("%d tokens held under the salt's key, want %d", got, want)
			}
			for _, other := range []string{"", "s2"} {
				if got := evHeld(ix, evKey(tokenize.SaltedName(tc.name2, other), a), reps[0]); got != 0 && other != tc.salt {
					t.Errorf("a request of salt %q matches %d tokens", other, got)
				}
			}
		})
	}
}

// TestEventsLiveRule: a replica is live while connected and synced, and,
// with MaxSilence, while its last message is recent enough or fewer than
// SilentRequests requests were sent to it since its last batch (an idle
// engine is silent).
func TestEventsLiveRule(t *testing.T) {
	now := time.Now()
	rep := evTestFleet(t, 1)[0]
	f := &evFollow{rep: rep}
	for _, c := range []struct {
		silence   time.Duration
		connected bool
		synced    bool
		ago       time.Duration
		sent      int // requests sent since the last batch
		want      bool
	}{
		{0, true, true, time.Hour, 100, true},
		{0, false, true, 0, 0, false},
		{0, true, false, 0, 0, false},
		{time.Minute, true, true, time.Second, 100, true},
		{time.Minute, true, true, 2 * time.Minute, 0, true},
		{time.Minute, true, true, 2 * time.Minute, SilentRequests - 1, true},
		{time.Minute, true, true, 2 * time.Minute, SilentRequests, false},
		{time.Minute, false, true, time.Second, 0, false},
	} {
		e := &Events{o: EventsOptions{MaxSilence: c.silence}}
		f.synced.Store(c.synced)
		f.sentAt.Store(rep.Dispatched())
		for range c.sent {
			rep.Acquire()()
		}
		if got := e.live(f, kvevents.Status{Live: c.connected, LastMessage: now.Add(-c.ago)}, now); got != c.want {
			t.Errorf("%+v: live %v", c, got)
		}
	}
}

// evModel is the plainest account of what the Index should hold after a
// sequence of events: every block stored and not removed, chained to the
// block its parent hash named when it was stored, is placed as far as
// every block before it is still held and is not alien. With spaces,
// sequences start in one of evSpaces' namespaces and their blocks may
// take a hash that a block of another namespace has (as SGLang's hashes
// leave the namespace out); a removal names a hash and drops one store of
// it from every namespace.
type evModel struct {
	bs     int
	spaces bool
	byHash map[evModelKey]*evModelBlock
	next   uint64
	tok    uint32
}

type evModelKey struct {
	hash  uint64
	space int // index in evSpaces
}

type evModelBlock struct {
	evModelKey
	parent *evModelBlock
	toks   []uint32
	refs   int
	alien  bool
}

// evSpaces are the namespaces of evModel's sequences: the replica's
// model, an adapter, and a cache salt as SGLang's metadata names it.
var evSpaces = []struct{ lora, salt string }{{}, {lora: "ad"}, {salt: "s1"}}

// evSpaceName is the name a request's key in namespace i starts from.
func evSpaceName(i int) string {
	name := evTestModel
	if evSpaces[i].lora != "" {
		name = evSpaces[i].lora
	}
	return tokenize.SaltedName(name, evSpaces[i].salt)
}

// tokens returns the tokens of the path up to b and how many of them lie
// before the first block removed or alien.
func (b *evModelBlock) tokens() (toks []uint32, hittable int) {
	var chain []*evModelBlock
	for c := b; c != nil; c = c.parent {
		chain = append(chain, c)
	}
	hittable = -1
	for i := len(chain) - 1; i >= 0; i-- {
		if c := chain[i]; (c.refs == 0 || c.alien) && hittable < 0 {
			hittable = len(toks)
		}
		toks = append(toks, chain[i].toks...)
	}
	if hittable < 0 {
		hittable = len(toks)
	}
	return toks, hittable
}

// key is the exact key of b's path in its namespace.
func (b *evModelBlock) key() []uint32 {
	toks, _ := b.tokens()
	return evKey(evSpaceName(b.space), toks)
}

// expected returns the key prefixes the Index should hold.
func (m *evModel) expected() map[string]bool {
	set := make(map[string]bool)
	for _, b := range m.byHash {
		toks, hit := b.tokens()
		key := evKey(evSpaceName(b.space), toks[:hit])
		for l := 1; l <= len(key); l++ {
			set[fmt.Sprint(key[:l])] = true
		}
	}
	return set
}

// stored is a BlockStored of the model's block size in namespace space.
func (m *evModel) stored(space int, medium string) kvevents.BlockStored {
	return kvevents.BlockStored{BlockSize: m.bs, Medium: medium, LoraName: evSpaces[space].lora, CacheSalt: evSpaces[space].salt}
}

// step makes one random event, applies it to the model, and returns it.
func (m *evModel) step(r *rand.Rand) kvevents.Event {
	live := slices.SortedFunc(maps.Keys(m.byHash), func(a, b evModelKey) int {
		return cmp.Or(cmp.Compare(a.hash, b.hash), cmp.Compare(a.space, b.space))
	})
	pick := func() *evModelBlock { return m.byHash[live[r.IntN(len(live))]] }
	switch x := r.IntN(100); {
	case x < 1:
		clear(m.byHash)
		return kvevents.AllBlocksCleared{}
	case x < 40 && len(live) > 0:
		h := pick().hash
		for _, b := range m.byHash {
			if b.hash != h {
				continue
			}
			if b.refs--; b.refs == 0 {
				delete(m.byHash, b.evModelKey)
			}
		}
		return kvevents.BlockRemoved{BlockHashes: []uint64{h}}
	case x < 48 && len(live) > 0:
		// Another medium stores a held block again.
		b := pick()
		b.refs++
		ev := m.stored(b.space, "CPU")
		ev.BlockHashes, ev.TokenIDs = []uint64{b.hash}, b.toks
		if b.parent != nil {
			ev.ParentHash, ev.HasParent = b.parent.hash, true
		}
		return ev
	}
	var parent *evModelBlock
	if len(live) > 0 && r.IntN(4) > 0 {
		parent = pick()
	}
	space := 0
	switch {
	case parent != nil:
		space = parent.space
	case m.spaces:
		space = r.IntN(len(evSpaces))
	}
	ev := m.stored(space, "GPU")
	if parent != nil {
		ev.ParentHash, ev.HasParent = parent.hash, true
	}
	for range 1 + r.IntN(4) {
		m.next++
		h := m.next
		if o := m.byHash; m.spaces && len(live) > 0 && r.IntN(3) == 0 {
			// A hash that a block of another namespace has.
			if k := live[r.IntN(len(live))]; k.space != space && o[evModelKey{k.hash, space}] == nil {
				h = k.hash
			}
		}
		b := &evModelBlock{evModelKey: evModelKey{h, space}, parent: parent, refs: 1, alien: r.IntN(30) == 0}
		for range m.bs {
			m.tok++
			b.toks = append(b.toks, m.tok)
		}
		var extra []byte
		if b.alien {
			extra = []byte{0x91, 0x92, 0xa2, 'm', 'm', 0xa1, 'h'} // [("mm", "h")]: a multimodal input
		}
		ev.BlockHashes = append(ev.BlockHashes, b.hash)
		ev.TokenIDs = append(ev.TokenIDs, b.toks...)
		ev.ExtraKeys = append(ev.ExtraKeys, extra)
		m.byHash[b.evModelKey] = b
		parent = b
	}
	return ev
}

// TestEventsRandom: random stores (new runs, runs under any held block,
// second stores of held blocks, blocks with extra keys), removals and
// clears leave the Index holding what evModel says, for engine block
// sizes equal to, below, above and not dividing the key block; and with
// sequences in several namespaces whose blocks share hashes.
func TestEventsRandom(t *testing.T) {
	for _, spaces := range []bool{false, true} {
		for _, bs := range []int{16, 4, 32, 24, 5} {
			for seed := range uint64(3) {
				t.Run(fmt.Sprint("spaces=", spaces, "/", bs, "/", seed), func(t *testing.T) {
					evRandom(t, spaces, bs, seed)
				})
			}
		}
	}
}

func evRandom(t *testing.T, spaces bool, bs int, seed uint64) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	m := &evModel{bs: bs, spaces: spaces, byHash: make(map[evModelKey]*evModelBlock)}
	r := rand.New(rand.NewPCG(seed, uint64(bs))) //nolint:gosec // a test's block size
	for i := range 300 {
		// Batches of up to 4 events: removals in one are evicted
		// together.
		evs := make([]kvevents.Event, 1+r.IntN(4))
		for j := range evs {
			evs[j] = m.step(r)
		}
		ev := evs[len(evs)-1]
		evApply(s, evs...)
		want := m.expected()
		if got := evHeldAll(ix, reps[0]); got != int64(len(want)*evTestBlock) {
			t.Fatalf("step %d (%T): %d tokens held, want %d", i, ev, got, len(want)*evTestBlock)
		}
		for _, b := range m.byHash {
			key := b.key()
			l := 0
			for l < len(key) && want[fmt.Sprint(key[:l+1])] {
				l++
			}
			if got := evHeld(ix, key, reps[0]); got != l*evTestBlock {
				t.Fatalf("step %d (%T): block %v holds %d tokens, want %d", i, ev, b.evModelKey, got, l*evTestBlock)
			}
		}
	}
	if len(m.byHash) == 0 && (len(s.byHash) != 0 || len(s.spaces) != 0) {
		t.Fatalf("nothing held, yet %d keys and %d spaced hashes kept", len(s.byHash), len(s.spaces))
	}
}

// BenchmarkEventsConversation stores a conversation of 2048 blocks in one
// run and removes it block by block, last block first (as an engine frees
// a request's blocks) or first block first.
func BenchmarkEventsConversation(b *testing.B) {
	for _, order := range []string{"last-first", "first-first"} {
		b.Run(order, func(b *testing.B) {
			s, _, _ := evTestState(b, DefaultMaxBlocks)
			run := evRun(1, 0, evToks(1, 2048*evTestBlock), evTestBlock)
			hs := slices.Clone(run.BlockHashes)
			if order == "last-first" {
				slices.Reverse(hs)
			}
			removed := kvevents.Batch{}
			for _, h := range hs {
				removed.Events = append(removed.Events, kvevents.BlockRemoved{BlockHashes: []uint64{h}})
			}
			stored := kvevents.Batch{Events: []kvevents.Event{run}}
			benchStoreRemove(b, s, stored, removed)
		})
	}
}

// benchStoreRemove measures applying stored and then removed to s.
func benchStoreRemove(b *testing.B, s *evState, stored, removed kvevents.Batch) {
	now := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		s.apply(stored, now)
		s.apply(removed, now)
	}
}

// BenchmarkEventsPages stores 1024 pages of one token (SGLang's default
// page size), one BlockStored each, and removes them last page first.
func BenchmarkEventsPages(b *testing.B) {
	s, _, _ := evTestState(b, DefaultMaxBlocks)
	toks := evToks(1, 1024)
	stored, removed := kvevents.Batch{}, kvevents.Batch{}
	for i := range toks {
		stored.Events = append(stored.Events, evRun(uint64(i+1), uint64(i), toks[i:i+1], 1)) //nolint:gosec // small
	}
	for i := len(toks); i > 0; i-- {
		removed.Events = append(removed.Events, kvevents.BlockRemoved{BlockHashes: []uint64{uint64(i)}}) //nolint:gosec // small
	}
	benchStoreRemove(b, s, stored, removed)
}

// evCapFleet is one replica serving evTestModel whose configured cache
// holds tokens.
func evCapFleet(t testing.TB, tokens int64) *backends.Replica {
	t.Helper()
	f, err := backends.NewFleet([]backends.Spec{{Name: "cap", URL: "http://127.0.0.1:21100", Engine: backends.EngineVLLM,
		Models: []string{evTestModel}, CacheTokens: tokens}}, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f.Replicas()[0]
}

// evDistinct stores blocks from up to n as runs of 8 chained blocks, each
// run new.
func evDistinct(s *evState, from, n int) {
	for i := from; i < n; i += 8 {
		evApply(s, evRun(uint64(i)+1, 0, evToks(uint32(i), 8*evTestBlock), evTestBlock)) //nolint:gosec // test data
	}
}

// TestEventsCapacityBound: a replica that reports more blocks than its
// capacity holds cannot keep more than twice that capacity in kvroute,
// however far below MaxBlocks; one of unknown capacity is bounded by
// MaxBlocks alone.
func TestEventsCapacityBound(t *testing.T) {
	const capBlocks = 2048
	tests := []struct {
		name   string
		tokens int64
		want   int // the most blocks kept
	}{
		{"configured capacity", capBlocks * evTestBlock, capRoom * (capBlocks + 1)},
		{"unknown capacity", 0, 1 << 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := evCapFleet(t, tc.tokens)
			c := &evCounters{}
			s := newEvState(evTestIndex(), rep, evFirstModel, evTestBlock, 1<<15, c)
			most := 0
			for i := range 8 {
				evDistinct(s, i*capBlocks, (i+1)*capBlocks)
				most = max(most, s.used())
			}
			if most > tc.want {
				t.Errorf("%d blocks kept, bound %d", most, tc.want)
			}
			if tc.tokens > 0 && c.overflows.Load() == 0 {
				t.Errorf("no overflow after %d blocks from a replica of %d", 8*capBlocks, capBlocks)
			}
		})
	}
}

// evBlockBytes is what the state may cost per engine block of a key
// block's size (docs/memory.md's KV-events term).
const evBlockBytes = 160

// TestEventsBlockCost measures the heap a replica's state takes per block
// (runs of 8 blocks of the key block's size, over an Index too small to
// grow) and holds it under evBlockBytes.
func TestEventsBlockCost(t *testing.T) {
	if testing.Short() {
		t.Skip("stores 400,000 blocks")
	}
	// Salted: every block in a namespace of its own (SGLang's salt), which
	// keeps its hash a second time for removals.
	for _, salted := range []bool{false, true} {
		t.Run(fmt.Sprint("salted=", salted), func(t *testing.T) {
			const n = 400_000
			ix := index.New(index.Options{KeyBlock: evTestBlock, DefaultBudget: 1 << 10, MaxBytes: 1 << 20})
			s := newEvState(ix, evTestFleet(t, 1)[0], evFirstModel, evTestBlock, DefaultMaxBlocks, &evCounters{})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for i := 0; i < n; i += 8 {
				run := evRun(uint64(i)+1, 0, evToks(uint32(i), 8*evTestBlock), evTestBlock) //nolint:gosec // test data
				if salted {
					run.CacheSalt = "tenant"
				}
				evApply(s, run)
			}
			runtime.GC()
			runtime.ReadMemStats(&after)
			per := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / n //nolint:gosec // heap sizes
			t.Logf("%d blocks kept: %d bytes of heap per block", s.used(), per)
			if s.used() != n {
				t.Fatalf("%d blocks kept, want %d", s.used(), n)
			}
			if per > evBlockBytes {
				t.Errorf("%d bytes per block, over the %d documented", per, evBlockBytes)
			}
			runtime.KeepAlive(s)
		})
	}
}

// TestEventsCutBetweenValues: a block that completes no key value of its
// own (engine blocks smaller than the key block) and is alien cuts what a
// run stored after it later may place, however the path was walked
// before.
func TestEventsCutBetweenValues(t *testing.T) {
	s, ix, reps := evTestState(t, DefaultMaxBlocks)
	const bs = evTestBlock / 2
	a := evToks(1, 4*evTestBlock)
	first := evRun(1, 0, a[:3*bs], bs) // blocks 1-3: one value, block 3 half of the next
	first.ExtraKeys = [][]byte{nil, nil, evEnc(t, []any{[]any{"mm", "h"}})}
	evApply(s, first)
	evApply(s, evRun(4, 3, a[3*bs:4*bs], bs)) // completes the second value past the alien block
	if got := evHeld(ix, evKey(evTestModel, a), reps[0]); got != evTestBlock {
		t.Fatalf("%d tokens held past an alien block, want the %d before it", got, evTestBlock)
	}
	if got := evHeldAll(ix, reps[0]); got != evTestBlock {
		t.Fatalf("replica holds %d tokens, want %d", got, evTestBlock)
	}
}

// TestEventsNamespaces: base-model, adapter and salted blocks with equal
// tokens are each placed under their own key and never match another's,
// whether the engine's hashes tell them apart (vLLM's include the adapter
// and the salt) or not (SGLang's leave both out, one page per event); a
// removal, which names a hash alone, takes it from every namespace that
// holds it.
func TestEventsNamespaces(t *testing.T) {
	a := evToks(1, 2*evTestBlock)
	spaces := []struct {
		name string // the key's model or adapter
		lora string
		salt string
	}{
		{name: evTestModel},
		{name: "ad", lora: "ad"},
		{name: evTestModel, salt: "s1"},
	}
	for _, engine := range []string{"vllm", "sglang"} {
		t.Run(engine, func(t *testing.T) {
			s, ix, reps := evTestState(t, DefaultMaxBlocks)
			removal := make([]uint64, 0, len(spaces))
			for i, sp := range spaces {
				// vLLM: distinct hashes, the salt in the first block's
				// extra keys; SGLang: equal hashes, the salt in the
				// metadata.
				first := uint64(1)
				if engine == "vllm" {
					first = uint64(10*i + 1) //nolint:gosec // small
				}
				run := evRun(first, 0, a, evTestBlock)
				run.LoraName = sp.lora
				switch {
				case engine == "sglang":
					run.CacheSalt = sp.salt
				case sp.salt != "":
					run.ExtraKeys = [][]byte{evEnc(t, []any{[]any{"cache_salt", sp.salt}}), nil}
				}
				evApply(s, run)
				removal = append(removal, run.BlockHashes[1])
				// Its own key is held whole; the keys of the
				// namespaces not stored yet match nothing.
				for j, other := range spaces[i:] {
					got, want := evHeld(ix, evKey(tokenize.SaltedName(other.name, other.salt), a), reps[0]), 0
					if j == 0 {
						want = len(a)
					}
					if got != want {
						t.Errorf("after storing %s/%q: %s/%q holds %d tokens, want %d", sp.name, sp.salt, other.name, other.salt, got, want)
					}
				}
			}
			if got := evHeldAll(ix, reps[0]); got != int64(3*len(a)) {
				t.Fatalf("%d tokens held, want each namespace's %d", got, len(a))
			}
			evApply(s, kvevents.BlockRemoved{BlockHashes: slices.Compact(removal)})
			if got := evHeldAll(ix, reps[0]); got != int64(3*evTestBlock) {
				t.Fatalf("after removing every namespace's second block: %d tokens held, want %d", got, 3*evTestBlock)
			}
			if s.c.unknownRemoved.Load() != 0 {
				t.Fatalf("%d removals of unknown blocks", s.c.unknownRemoved.Load())
			}
			evApply(s, kvevents.AllBlocksCleared{})
			if s.used() != 0 || len(s.byHash) != 0 || len(s.spaces) != 0 {
				t.Fatalf("cleared, yet %d slots, %d keys, %d spaced hashes", s.used(), len(s.byHash), len(s.spaces))
			}
		})
	}
}
