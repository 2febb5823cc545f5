package radix

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func seq(from, n uint32) []uint32 {
	k := make([]uint32, n)
	for i := range k {
		k[i] = from + uint32(i)
	}
	return k
}

func cat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

func mustValid(tb testing.TB, tr *Tree) {
	tb.Helper()
	if err := checkInvariants(tr); err != nil {
		tb.Fatal(err)
	}
}

func TestInsertMatch(t *testing.T) {
	type ins struct {
		key  []uint32
		r    ReplicaID
		want int // alreadyHeld
	}
	type query struct {
		key  []uint32
		want map[ReplicaID]int
	}
	A, B, C := seq(1, 4), seq(100, 3), seq(200, 5)
	tests := []struct {
		name    string
		inserts []ins
		queries []query
	}{
		{"empty tree", nil, []query{{A, map[ReplicaID]int{}}, {nil, map[ReplicaID]int{}}}},
		{"exact", []ins{{A, 0, 0}}, []query{{A, map[ReplicaID]int{0: 4}}}},
		{"stored key is prefix of query", []ins{{A, 0, 0}}, []query{{cat(A, B), map[ReplicaID]int{0: 4}}}},
		{"query is prefix of stored key", []ins{{cat(A, B), 0, 0}}, []query{{A[:2], map[ReplicaID]int{0: 2}}}},
		{"diverge mid-label", []ins{{cat(A, B), 0, 0}}, []query{{cat(A[:3], C), map[ReplicaID]int{0: 3}}}},
		{"first token differs", []ins{{A, 0, 0}}, []query{{B, map[ReplicaID]int{}}}},
		{"empty key is a no-op", []ins{{nil, 0, 0}}, []query{{A, map[ReplicaID]int{}}}},
		{"reinsert reports held", []ins{{A, 0, 0}, {A, 0, 4}, {A[:2], 0, 2}}, []query{{A, map[ReplicaID]int{0: 4}}}},
		{"extend held key", []ins{{A, 0, 0}, {cat(A, B), 0, 4}}, []query{{cat(A, B, C), map[ReplicaID]int{0: 7}}}},
		{"branch", []ins{{cat(A, B), 0, 0}, {cat(A, C), 0, 4}}, []query{
			{cat(A, B), map[ReplicaID]int{0: 7}},
			{cat(A, C), map[ReplicaID]int{0: 9}},
			{cat(A, A), map[ReplicaID]int{0: 4}},
		}},
		{"replicas with different depths", []ins{{cat(A, B), 0, 0}, {cat(A[:2], C), 1, 0}, {cat(A, B, C), 2, 0}}, []query{
			{cat(A, B, C), map[ReplicaID]int{0: 7, 1: 2, 2: 12}},
			{cat(A[:2], C), map[ReplicaID]int{0: 2, 1: 7, 2: 2}},
			{A[:1], map[ReplicaID]int{0: 1, 1: 1, 2: 1}},
		}},
		{"another replica's insert reports 0", []ins{{A, 0, 0}, {A, 1, 0}, {cat(A, B), 1, 4}}, []query{
			{cat(A, B), map[ReplicaID]int{0: 4, 1: 7}},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(Options{})
			for i, in := range tc.inserts {
				if got := tr.Insert(in.key, in.r, at(int64(i))); got != in.want {
					t.Errorf("insert %d: alreadyHeld = %d, want %d", i, got, in.want)
				}
				mustValid(t, tr)
			}
			for _, q := range tc.queries {
				if got := matchMap(t, tr, q.key, time.Time{}); !maps.Equal(got, q.want) {
					t.Errorf("Match(%v) = %v, want %v", q.key, got, q.want)
				}
			}
		})
	}
}

func TestUndo(t *testing.T) {
	A, B, C := seq(1, 4), seq(100, 3), seq(200, 5)
	tests := []struct {
		name  string
		setup func(tr *Tree) (key []uint32, keep int)
		want  map[string]map[ReplicaID]int // query name -> result
	}{
		{"undo fresh insert", func(tr *Tree) ([]uint32, int) {
			return cat(A, B), tr.Insert(cat(A, B), 0, at(1))
		}, map[string]map[ReplicaID]int{"AB": {}, "A": {}}},
		{"undo keeps held prefix", func(tr *Tree) ([]uint32, int) {
			tr.Insert(A, 0, at(1))
			return cat(A, B), tr.Insert(cat(A, B), 0, at(2))
		}, map[string]map[ReplicaID]int{"AB": {0: 4}, "A": {0: 4}}},
		{"undo leaves other replicas", func(tr *Tree) ([]uint32, int) {
			tr.Insert(cat(A, B), 1, at(1))
			return cat(A, B), tr.Insert(cat(A, B), 0, at(2))
		}, map[string]map[ReplicaID]int{"AB": {1: 7}, "A": {1: 4}}},
		{"undo mid-node keep", func(tr *Tree) ([]uint32, int) {
			tr.Insert(cat(A, B), 0, at(1))
			return cat(A, B), 2
		}, map[string]map[ReplicaID]int{"AB": {0: 2}, "AC": {0: 2}}},
		{"undo removes longer keys (prefix-closure)", func(tr *Tree) ([]uint32, int) {
			tr.Insert(cat(A, C), 0, at(1))
			return cat(A, B), tr.Insert(cat(A, B), 0, at(2)) // keep = 4
		}, map[string]map[ReplicaID]int{"AB": {0: 4}, "AC": {0: 9}}},
		{"undo below shared prefix drops branch", func(tr *Tree) ([]uint32, int) {
			tr.Insert(cat(A, C), 0, at(1))
			tr.Insert(cat(A, B), 0, at(2))
			return cat(A, B), 2
		}, map[string]map[ReplicaID]int{"AB": {0: 2}, "AC": {0: 2}}},
		{"undo of key not held is a no-op", func(tr *Tree) ([]uint32, int) {
			tr.Insert(A, 1, at(1))
			return A, 0
		}, map[string]map[ReplicaID]int{"A": {1: 4}}},
		{"keep beyond key is a no-op", func(tr *Tree) ([]uint32, int) {
			tr.Insert(A, 0, at(1))
			return A, 9
		}, map[string]map[ReplicaID]int{"A": {0: 4}}},
	}
	keys := map[string][]uint32{"A": A, "AB": cat(A, B), "AC": cat(A, C)}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := New(Options{})
			key, keep := tc.setup(tr)
			tr.Undo(key, 0, keep)
			mustValid(t, tr)
			for q, want := range tc.want {
				if got := matchMap(t, tr, keys[q], time.Time{}); !maps.Equal(got, want) {
					t.Errorf("Match(%s) = %v, want %v", q, got, want)
				}
			}
		})
	}
}

func TestUndoRestoresShape(t *testing.T) {
	tr := New(Options{})
	base := seq(1, 100)
	tr.Insert(base, 0, at(1))
	before := tr.Stats()
	k := cat(base[:60], seq(500, 40))
	keep := tr.Insert(k, 0, at(1)) // same time: the split merges back on Undo
	if keep != 60 {
		t.Fatalf("keep = %d", keep)
	}
	tr.Undo(k, 0, keep)
	mustValid(t, tr)
	after := tr.Stats()
	if after.Nodes != before.Nodes || after.Tokens != before.Tokens || !maps.Equal(after.Held, before.Held) {
		t.Fatalf("stats after undo %+v, before %+v", after, before)
	}
}

func TestRemoveReplica(t *testing.T) {
	tr := New(Options{})
	A, B := seq(1, 10), seq(100, 10)
	tr.Insert(cat(A, B), 0, at(1))
	tr.Insert(A, 1, at(2))
	tr.Insert(B, 1, at(3))
	tr.RemoveReplica(0)
	tr.RemoveReplica(7) // unknown: no-op
	mustValid(t, tr)
	if got := matchMap(t, tr, cat(A, B), time.Time{}); !maps.Equal(got, map[ReplicaID]int{1: 10}) {
		t.Fatalf("after remove: %v", got)
	}
	st := tr.Stats()
	if st.Nodes != 2 || st.Tokens != 20 || !maps.Equal(st.Held, map[ReplicaID]int64{1: 20}) {
		t.Fatalf("stats %+v", st)
	}
	tr.RemoveReplica(1)
	if st := tr.Stats(); st.Nodes != 0 || st.Tokens != 0 || st.Bytes != 0 || len(st.Held) != 0 {
		t.Fatalf("empty tree stats %+v", st)
	}
}

func TestNotBefore(t *testing.T) {
	tr := New(Options{})
	A, B, C := seq(1, 10), seq(100, 10), seq(200, 10)
	tr.Insert(cat(A, B), 0, at(10))
	tr.Insert(cat(A, C), 0, at(20))
	tr.Insert(cat(A, B), 1, at(5))
	tests := []struct {
		key  []uint32
		nb   time.Time
		want map[ReplicaID]int
	}{
		{cat(A, B), time.Time{}, map[ReplicaID]int{0: 20, 1: 20}},
		{cat(A, B), at(6), map[ReplicaID]int{0: 20}},
		{cat(A, B), at(15), map[ReplicaID]int{0: 10}}, // A was touched at 20, B at 10
		{cat(A, C), at(20), map[ReplicaID]int{0: 20}},
		{cat(A, C), at(21), map[ReplicaID]int{}},
	}
	for _, tc := range tests {
		if got := matchMap(t, tr, tc.key, tc.nb); !maps.Equal(got, tc.want) {
			t.Errorf("Match(%v, %v) = %v, want %v", tc.key[:12], tc.nb, got, tc.want)
		}
	}
	// An older now does not make a path look older.
	tr.Insert(cat(A, B), 0, at(1))
	if got := matchMap(t, tr, cat(A, B), at(10)); !maps.Equal(got, map[ReplicaID]int{0: 20}) {
		t.Fatalf("after out-of-order insert: %v", got)
	}
	mustValid(t, tr)
}

func TestEvictBefore(t *testing.T) {
	tr := New(Options{})
	A, B, C := seq(1, 10), seq(100, 10), seq(200, 10)
	tr.Insert(cat(A, B), 0, at(10))
	tr.Insert(cat(A, C), 0, at(20))
	tr.Insert(cat(A, B), 1, at(5))
	if got := tr.EvictBefore(at(15)); got != 10+20 {
		t.Fatalf("released %d, want 30", got)
	}
	mustValid(t, tr)
	if got := matchMap(t, tr, cat(A, B), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 10}) {
		t.Fatalf("after EvictBefore: %v", got)
	}
	if st := tr.Stats(); st.Nodes != 1 || st.Tokens != 20 {
		t.Fatalf("stats %+v", st) // A and C re-merged into one node
	}
	if got := tr.EvictBefore(time.Time{}); got != 0 {
		t.Fatalf("zero cutoff released %d", got)
	}
	if got := tr.EvictBefore(at(100)); got != 20 {
		t.Fatalf("released %d, want 20", got)
	}
	if st := tr.Stats(); st.Nodes != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestLabelsDoNotAliasKey mutates the caller's key after Insert: the tree
// must be unaffected, and no label may point into the caller's array.
func TestLabelsDoNotAliasKey(t *testing.T) {
	tr := New(Options{})
	buf := seq(1, 1000)
	want := slices.Clone(buf)
	tr.Insert(buf, 0, at(1))
	tr.Insert(buf[:500], 1, at(2))                    // splits the stored label
	tr.Insert(cat(buf[:700], seq(5000, 5)), 2, at(3)) // branch
	for i := range buf {
		buf[i] = 999_999
	}
	got := matchMap(t, tr, want, time.Time{})
	if !maps.Equal(got, map[ReplicaID]int{0: 1000, 1: 500, 2: 700}) {
		t.Fatalf("after mutating key: %v", got)
	}
	lo := uintptr(unsafe.Pointer(&buf[0]))
	hi := lo + uintptr(len(buf))*4
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	stack := []*node{tr.root}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if len(x.label) > 0 {
			p := uintptr(unsafe.Pointer(&x.label[0]))
			if p >= lo && p < hi {
				t.Fatal("label aliases the caller's key")
			}
		}
		for _, e := range x.children {
			stack = append(stack, e.n)
		}
	}
}

func TestLongKey100k(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := make([]uint32, 100_000)
	for i := range key {
		key[i] = rng.Uint32N(50_000)
	}
	tr := New(Options{DefaultBudget: 1 << 30})
	if got := tr.Insert(key, 0, at(1)); got != 0 {
		t.Fatalf("alreadyHeld %d", got)
	}
	k2 := cat(key[:50_000], seq(1<<20, 50_000))
	if got := tr.Insert(k2, 1, at(2)); got != 0 {
		t.Fatalf("alreadyHeld %d", got)
	}
	if got := matchMap(t, tr, key, time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 100_000, 1: 50_000}) {
		t.Fatalf("match %v", got)
	}
	// A chain of 1000 nodes: ever shorter prefixes touched at ever later
	// times, so neighbouring nodes differ in time and never merge. Segment s
	// (tokens 100s..100s+99) ends up last used at 1009-s.
	for j := range 1000 {
		tr.Insert(key[:100*(1000-j)], 2, at(int64(10+j)))
	}
	mustValid(t, tr)
	if st := tr.Stats(); st.Nodes < 1000 {
		t.Fatalf("expected a deep chain, got %d nodes", st.Nodes)
	}
	if got := matchMap(t, tr, key, at(510)); got[2] != 50_000 || got[0] != 0 {
		t.Fatalf("match with notBefore: %v", got)
	}
	tr.Undo(key, 2, 30_000)
	if got := matchMap(t, tr, key, time.Time{}); got[2] != 30_000 {
		t.Fatalf("after undo: %v", got)
	}
	if released := tr.EvictBefore(at(100)); released == 0 {
		t.Fatal("EvictBefore released nothing")
	}
	tr.RemoveReplica(0)
	tr.RemoveReplica(2)
	mustValid(t, tr)
	if got := matchMap(t, tr, key, time.Time{}); !maps.Equal(got, map[ReplicaID]int{}) {
		t.Fatalf("after removals: %v", got) // replica 1 was evicted by the cutoff at 100
	}
}

// TestChainMerges builds a path cut into 2000 nodes that differ only in one
// replica's times. Touching the whole path makes the nodes identical but must
// not merge them (Insert never copies the path); removing that replica must
// then collapse the chain into one node. (Merges append to the surviving
// label, so this is linear, not quadratic, in the path length.)
func TestChainMerges(t *testing.T) {
	key := seq(1, 20_000)
	for _, touchFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("touch=%v", touchFirst), func(t *testing.T) {
			tr := New(Options{DefaultBudget: 1 << 30})
			tr.Insert(key, 0, at(1))
			for j := range 2000 {
				tr.Insert(key[:10*(2000-j)], 1, at(int64(10+j)))
			}
			if n := tr.Stats().Nodes; n != 2000 {
				t.Fatalf("chain of %d nodes", n)
			}
			if touchFirst {
				tr.Insert(key, 1, at(1e6))
				tr.Insert(key, 0, at(1e6))
				mustValid(t, tr)
				if n := tr.Stats().Nodes; n != 2000 {
					t.Fatalf("touching changed the chain to %d nodes", n)
				}
				if got := matchMap(t, tr, key, at(1e6)); !maps.Equal(got, map[ReplicaID]int{0: 20_000, 1: 20_000}) {
					t.Fatalf("match after touch: %v", got)
				}
			}
			tr.RemoveReplica(1)
			mustValid(t, tr)
			if n := tr.Stats().Nodes; n != 1 {
				t.Fatalf("%d nodes after collapse", n)
			}
		})
	}
}

func TestMatchIntoZeroAllocs(t *testing.T) {
	tr := New(Options{})
	rng := rand.New(rand.NewPCG(3, 4))
	key := make([]uint32, 4096)
	for i := range key {
		key[i] = rng.Uint32N(1000)
	}
	for r := range ReplicaID(16) {
		tr.Insert(cat(key[:256*(int(r)+1)], seq(uint32(r)<<20, 64)), r, at(int64(r)))
	}
	dst := make([]Match, 0, 16)
	for _, nb := range []time.Time{{}, at(8)} {
		allocs := testing.AllocsPerRun(100, func() { dst = tr.MatchInto(dst, key, nb) })
		if allocs != 0 {
			t.Fatalf("MatchInto allocates %v times per call", allocs)
		}
	}
	if len(dst) != 8 {
		t.Fatalf("got %d matches with notBefore, want 8", len(dst))
	}
}

func TestOptionsDefaults(t *testing.T) {
	tr := New(Options{})
	if tr.maxBytes != DefaultMaxBytes || tr.defBudget != DefaultBudget {
		t.Fatalf("defaults: %d %d", tr.maxBytes, tr.defBudget)
	}
}

// TestUnit checks a tree whose key values stand for blocks of 16 tokens:
// lengths come out in tokens and budgets go in as tokens.
func TestUnit(t *testing.T) {
	const unit = 16
	tr := New(Options{Unit: unit, DefaultBudget: 100 * unit})
	if tr.defBudget != 100 {
		t.Fatalf("default budget %d values, want 100", tr.defBudget)
	}
	now := time.Unix(1000, 0)
	tr.Insert(seq(1, 10), 0, now)
	tr.Insert(cat(seq(1, 4), seq(50, 3)), 1, now)
	got := tr.MatchInto(nil, cat(seq(1, 6), seq(90, 2)), time.Time{})
	slices.SortFunc(got, func(a, b Match) int { return int(a.Replica) - int(b.Replica) })
	if want := []Match{{0, 6 * unit}, {1, 4 * unit}}; !slices.Equal(got, want) {
		t.Fatalf("MatchInto = %v, want %v", got, want)
	}
	st := tr.Stats()
	if st.Tokens != 13*unit || st.Held[0] != 10*unit || st.Held[1] != 7*unit {
		t.Fatalf("Stats = %+v, want 208 tokens, held 160 and 112", st)
	}
	// A budget of 5 blocks (in tokens, rounded down to whole values)
	// evicts replica 0 down to 90% of it.
	tr.SetBudget(0, 5*unit+unit-1)
	if h := tr.Stats().Held[0]; h > 5*unit {
		t.Fatalf("replica 0 holds %d tokens over a budget of %d", h, 5*unit)
	}
	// A budget below one value still allows one.
	tr.SetBudget(1, unit/2)
	if tr.budgetOf(1) != 1 {
		t.Fatalf("budget of half a value became %d values", tr.budgetOf(1))
	}
	if released := tr.EvictBefore(now.Add(time.Second)); released%unit != 0 || released == 0 {
		t.Fatalf("EvictBefore released %d tokens, want a positive multiple of %d", released, unit)
	}
	mustValid(t, tr)
}

func TestConcurrentUse(t *testing.T) {
	tr := New(Options{DefaultBudget: 2000, MaxBytes: 200_000})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			dst := make([]Match, 0, 8)
			key := make([]uint32, 0, 200)
			for i := range 2000 {
				key = key[:0]
				for range 20 + rng.IntN(180) {
					key = append(key, rng.Uint32N(4))
				}
				r := ReplicaID(rng.IntN(8))
				dst = tr.MatchInto(dst, key, time.Time{})
				keep := tr.Insert(key, r, time.Now())
				switch i % 50 {
				case 7:
					tr.Undo(key, r, keep)
				case 13:
					tr.RemoveReplica(r)
				case 29:
					tr.EvictBefore(time.Now().Add(-time.Millisecond))
				case 41:
					tr.SetBudget(r, int64(500+rng.IntN(3000)))
				case 47:
					_ = tr.Stats()
				}
			}
		}()
	}
	wg.Wait()
	mustValid(t, tr)
}

// TestExtendLeafInPlace: a conversation that stays on one replica keeps one
// leaf, grown in place, and the leaf splits and branches like any other.
func TestExtendLeafInPlace(t *testing.T) {
	A, B, C := seq(1, 400), seq(1000, 300), seq(2000, 300)
	tr := New(Options{})
	tr.Insert(A, 0, at(1))
	if got := tr.Insert(cat(A, B), 0, at(2)); got != len(A) {
		t.Fatalf("alreadyHeld %d, want %d", got, len(A))
	}
	mustValid(t, tr)
	st := tr.Stats()
	if st.Nodes != 1 || st.Tokens != 700 {
		t.Fatalf("after extending: %d nodes, %d tokens; want 1, 700", st.Nodes, st.Tokens)
	}
	if least := int64(NodeBytes + 700*TokenBytes); st.Bytes < least {
		t.Fatalf("Bytes %d below %d", st.Bytes, least)
	}
	if got := matchMap(t, tr, cat(A, B, C), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 700}) {
		t.Fatalf("match %v", got)
	}
	// A second holder stops growth in place: its tail is a new leaf.
	tr.Insert(cat(A, B, C), 1, at(3))
	tr.Insert(cat(A, B, C, A), 0, at(4))
	mustValid(t, tr)
	if n := tr.Stats().Nodes; n != 3 {
		t.Fatalf("%d nodes, want 3", n)
	}
	// A branch inside the grown label splits it.
	tr.Insert(cat(A, C), 0, at(5))
	mustValid(t, tr)
	want := map[ReplicaID]int{0: 400 + 300 + 300 + 400, 1: 1000}
	if got := matchMap(t, tr, cat(A, B, C, A), time.Time{}); !maps.Equal(got, want) {
		t.Fatalf("match %v, want %v", got, want)
	}
	if got := matchMap(t, tr, cat(A, C), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 700, 1: 400}) {
		t.Fatalf("branch match %v", got)
	}
	tr.Undo(cat(A, B), 0, len(A))
	mustValid(t, tr)
	if got := matchMap(t, tr, cat(A, B), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 400, 1: 700}) {
		t.Fatalf("after undo %v", got)
	}
}

// TestGrownLabelBound: a conversation longer than maxGrownLabel continues in
// new leaves, each grown in place up to the bound.
func TestGrownLabelBound(t *testing.T) {
	key := seq(1, 3*maxGrownLabel)
	tr := New(Options{})
	for n := 300; n <= len(key); n += 300 {
		tr.Insert(key[:n], 0, at(int64(n)))
		mustValid(t, tr)
	}
	st := tr.Stats()
	if st.Tokens != int64(len(key)/300*300) {
		t.Fatalf("%d tokens", st.Tokens)
	}
	if st.Nodes < 3 || st.Nodes > 4 {
		t.Fatalf("%d nodes, want 3 or 4 of at most %d tokens", st.Nodes, maxGrownLabel)
	}
	for x := tr.root; len(x.children) > 0; {
		x = x.children[0].n
		// Growth rounds capacity up to a size class, below 32 KiB.
		if len(x.label) > maxGrownLabel || cap(x.label)*4 > 32<<10 {
			t.Fatalf("label of %d tokens, capacity %d", len(x.label), cap(x.label))
		}
	}
	if got := matchMap(t, tr, key, time.Time{}); got[0] != int(st.Tokens) {
		t.Fatalf("match %v", got)
	}
}

// TestWideNodes covers nodes with more children than indexAt: they index
// them, keep the index through removals and merges, and drop it once few
// children are left.
func TestWideNodes(t *testing.T) {
	const wide = 3 * indexAt
	tr := New(Options{DefaultBudget: 1 << 30})
	// [1] is held by replicas 0 and 1; below it [2] by 0 alone, with wide
	// children [2, 1000+i]. All at one time, so that [1] and [2] merge once
	// replica 1 leaves.
	tr.Insert([]uint32{1}, 1, at(1))
	for i := range wide {
		tr.Insert([]uint32{1, 2, 1000 + uint32(i)}, 0, at(1))
	}
	mustValid(t, tr)
	tr.RemoveReplica(1)
	mustValid(t, tr)
	if n := tr.Stats().Nodes; n != 1+wide {
		t.Fatalf("%d nodes after the merge, want %d", n, 1+wide)
	}
	for i := range wide {
		key := []uint32{1, 2, 1000 + uint32(i)}
		if got := matchMap(t, tr, key, time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 3}) {
			t.Fatalf("match %v after the merge: %v", key, got)
		}
	}
	// Remove children from the middle down to a few, checking every step.
	for i := range wide - 4 {
		tr.Undo([]uint32{1, 2, 1000 + uint32(wide-1-i)}, 0, 2)
		mustValid(t, tr)
	}
	for i := range wide {
		want := map[ReplicaID]int{0: 3}
		if i >= 4 {
			want = map[ReplicaID]int{0: 2}
		}
		key := []uint32{1, 2, 1000 + uint32(i)}
		if got := matchMap(t, tr, key, time.Time{}); !maps.Equal(got, want) {
			t.Fatalf("match %v after removals: %v, want %v", key, got, want)
		}
	}
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	if tr.indexed != 0 {
		t.Fatalf("%d index entries left with 4 children", tr.indexed)
	}
}
