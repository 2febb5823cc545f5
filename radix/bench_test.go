package radix

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
)

func randTokens(rng *rand.Rand, n int) []uint32 {
	k := make([]uint32, n)
	for i := range k {
		k[i] = rng.Uint32N(128_000)
	}
	return k
}

// chatFixture is a tree shaped like chat traffic over 8 replicas: 16 system
// prompts of 2k tokens, each followed by conversations of 6k more tokens.
type chatFixture struct {
	tr    *Tree
	convs [][]uint32 // 8k tokens each
}

func newChatFixture(convs int, opts Options) *chatFixture {
	rng := rand.New(rand.NewPCG(11, 12))
	sys := make([][]uint32, 16)
	for i := range sys {
		sys[i] = randTokens(rng, 2048)
	}
	f := &chatFixture{tr: New(opts)}
	for i := range convs {
		k := cat(sys[i%len(sys)], randTokens(rng, 6144))
		f.convs = append(f.convs, k)
		f.tr.Insert(k, ReplicaID(i%8), at(int64(i)))
	}
	return f
}

// BenchmarkMatchInsert8k is the routing hot path: match an 8k-token prompt
// that shares its first 4k tokens with earlier conversations, then record it
// (a new 4k-token leaf) for one of 8 replicas. Budget evictions run in
// batches along the way.
func BenchmarkMatchInsert8k(b *testing.B) {
	f := newChatFixture(800, Options{})
	rng := rand.New(rand.NewPCG(5, 6))
	bases := make([][]uint32, 32)
	for i := range bases {
		bases[i] = cat(f.convs[len(f.convs)-1-i][:4096], randTokens(rng, 4096))
	}
	dst := make([]Match, 0, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key := bases[i%len(bases)]
		key[4096] = 1<<24 + uint32(i) // unique continuation
		dst = f.tr.MatchInto(dst, key, time.Time{})
		f.tr.Insert(key, ReplicaID(i%8), at(int64(1_000_000+i)))
	}
}

// BenchmarkMatch8k matches an 8k-token prompt held in full by one replica and
// in part (its system prompt) by others.
func BenchmarkMatch8k(b *testing.B) {
	f := newChatFixture(800, Options{DefaultBudget: 1 << 40})
	dst := make([]Match, 0, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		dst = f.tr.MatchInto(dst, f.convs[i%len(f.convs)], time.Time{})
	}
	if len(dst) == 0 {
		b.Fatal("no match")
	}
}

// BenchmarkMatch32k1000Replicas matches a 32k-token document of which 1000
// replicas each hold a different prefix (a multiple of 512 tokens) followed
// by a private 256-token continuation: 64 branch points along the path, each
// with hundreds of holders.
func BenchmarkMatch32k1000Replicas(b *testing.B) {
	tr := newReplicasFixture()
	doc := replicasDoc()
	dst := make([]Match, 0, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		dst = tr.MatchInto(dst, doc, time.Time{})
	}
	if len(dst) != 1000 {
		b.Fatalf("matched %d replicas", len(dst))
	}
}

// replicasDoc is the 32k-token document of newReplicasFixture.
func replicasDoc() []uint32 { return randTokens(rand.New(rand.NewPCG(7, 8)), 32768) }

// newReplicasFixture returns a tree where each of 1000 replicas holds a
// prefix of replicasDoc (a random multiple of 512 tokens) and a private
// 256-token continuation.
func newReplicasFixture() *Tree {
	doc := replicasDoc()
	rng := rand.New(rand.NewPCG(9, 10))
	tr := New(Options{})
	for r := range 1000 {
		l := 512 * (1 + rng.IntN(64))
		tr.Insert(cat(doc[:l], randTokens(rng, 256)), ReplicaID(r), at(int64(r)))
	}
	return tr
}

// BenchmarkBytesPerToken measures the heap a filled tree really uses
// (runtime.MemStats before and after filling) per stored token, next to the
// tree's own estimate (Stats.Bytes). "long" is chat-shaped traffic with 8k
// prompts; "branchy" is many short keys with a branch every few dozen tokens,
// where per-node costs dominate.
func BenchmarkBytesPerToken(b *testing.B) {
	shapes := []struct {
		name string
		fill func() *Tree
	}{
		{"long", func() *Tree { return newChatFixture(400, Options{DefaultBudget: 1 << 40}).tr }},
		{"1000replicas", func() *Tree { return newReplicasFixture() }},
		{"branchy", newBranchyFixture},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			measured, estimated := measureBytesPerToken(s.fill)
			b.ResetTimer() // the loop is empty: only the metrics matter
			for range b.N {
			}
			b.ReportMetric(measured, "B/token")
			b.ReportMetric(estimated, "est-B/token")
		})
	}
}

// measureBytesPerToken fills a tree and returns the measured and estimated
// bytes per stored token. The key generators' garbage is collected before
// the second reading; what they still retain (fixture keys) is small or
// excluded by building the tree through fill only.
func measureBytesPerToken(fill func() *Tree) (measured, estimated float64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr := fill()
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := tr.Stats()
	runtime.KeepAlive(tr)
	tok := float64(st.Tokens)
	return float64(after.HeapAlloc-before.HeapAlloc) / tok, float64(st.Bytes) / tok
}

// newBranchyFixture fills a tree with 20,000 short keys over a small
// alphabet, spread over 8 replicas: many small, branching nodes.
func newBranchyFixture() *Tree {
	rng := rand.New(rand.NewPCG(1, 1))
	tr := New(Options{DefaultBudget: 1 << 40})
	gen := &keyGen{rng: rng, alphabet: 50, maxLen: 400}
	for i := range 20_000 {
		tr.Insert(gen.next(), ReplicaID(rng.IntN(8)), at(int64(i)))
	}
	return tr
}

// newWideFixture is a tree of short prompts after one shared prefix: one
// node with 100k children, as in BenchmarkInsertWide.
func newWideFixture() *Tree {
	rng := rand.New(rand.NewPCG(3, 3))
	tr := New(Options{DefaultBudget: 1 << 40})
	for i := range 100_000 {
		tr.Insert(append([]uint32{7, 8}, randTokens(rng, 4)...), ReplicaID(i%8), at(int64(i)))
	}
	return tr
}

// BenchmarkInsertWide records short prompts that share their first two key
// values and then differ, as unique questions after one system prompt do:
// the shared node's fan-out reaches tens of thousands of children (the
// replicas' budgets together hold fanout of them), so budget evictions run in
// batches along the way, as in a router that has run for a while.
func BenchmarkInsertWide(b *testing.B) {
	for _, c := range []struct{ fanout, replicas int }{{1 << 10, 8}, {1 << 16, 8}} {
		b.Run(fmt.Sprintf("fanout=%d/replicas=%d", c.fanout, c.replicas), func(b *testing.B) {
			// Budgets count the shared two values once per replica.
			tr := New(Options{DefaultBudget: int64(c.fanout/c.replicas + 2)})
			key := []uint32{7, 8, 0}
			rng := rand.New(rand.NewPCG(1, 2))
			// Fill to the steady state first.
			for i := range 2 * c.fanout {
				key[2] = rng.Uint32()
				tr.Insert(key, ReplicaID(i%c.replicas), at(int64(i)))
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				n := 2*c.fanout + i
				key[2] = rng.Uint32()
				tr.Insert(key, ReplicaID(n%c.replicas), at(int64(n)))
			}
		})
	}
}

// BenchmarkUndoWide records a short prompt below a node with 65,536
// children and undoes it, as the proxy does when a request fails before
// its replica answered.
func BenchmarkUndoWide(b *testing.B) {
	const fanout = 1 << 16
	tr := New(Options{DefaultBudget: 1 << 30})
	key := []uint32{7, 8, 0}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range fanout {
		key[2] = rng.Uint32()
		tr.Insert(key, ReplicaID(i%8), at(int64(i)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		key[2] = rng.Uint32()
		keep := tr.Insert(key, ReplicaID(i%8), at(int64(fanout+i)))
		tr.Undo(key, ReplicaID(i%8), keep)
	}
}
