package radix

import (
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBudgetEvictsLRU(t *testing.T) {
	A, B, C, D, E := seq(1000, 100), seq(2000, 100), seq(3000, 100), seq(4000, 100), seq(5000, 100)
	tr := New(Options{})
	tr.SetBudget(0, 350) // low water 315
	tr.Insert(A, 0, at(1))
	tr.Insert(B, 0, at(2))
	tr.Insert(C, 0, at(3))
	tr.Insert(A, 1, at(4)) // another replica's use does not refresh replica 0
	tr.Insert(D, 0, at(5)) // 400 > 350: evict 85 from the oldest, A's tail
	held := func() map[string]int {
		out := map[string]int{}
		for name, k := range map[string][]uint32{"A": A, "B": B, "C": C, "D": D, "E": E} {
			if n := matchMap(t, tr, k, time.Time{})[0]; n > 0 {
				out[name] = n
			}
		}
		return out
	}
	if got := held(); !maps.Equal(got, map[string]int{"A": 15, "B": 100, "C": 100, "D": 100}) {
		t.Fatalf("after D: %v", got)
	}
	if got := matchMap(t, tr, A, time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 15, 1: 100}) {
		t.Fatalf("A after D: %v (replica 1 must keep it whole)", got)
	}
	tr.Insert(B, 0, at(6)) // touch B: C is now the oldest after what is left of A
	tr.Insert(E, 0, at(7)) // 415: A's 15 go, then 85 of C's tail
	if got := held(); !maps.Equal(got, map[string]int{"B": 100, "C": 15, "D": 100, "E": 100}) {
		t.Fatalf("after E: %v", got)
	}
	mustValid(t, tr)
}

// TestBudgetEvictsDeepestLeafFirst checks that eviction removes a replica
// from its least recently used leaf, tail first and only as much as the
// budget needs, and keeps the shared prefix it still uses.
func TestBudgetEvictsDeepestLeafFirst(t *testing.T) {
	P, Q1, Q2 := seq(1, 50), seq(100, 50), seq(200, 50)
	tr := New(Options{})
	tr.Insert(cat(P, Q1), 0, at(1))
	tr.Insert(cat(P, Q2), 0, at(2))
	tr.Insert(cat(P, Q1), 1, at(3))
	tr.SetBudget(0, 140) // holds 150; low water 126: the last 24 of Q1 (oldest leaf) go
	mustValid(t, tr)
	want := map[ReplicaID]int{0: 76, 1: 100}
	if got := matchMap(t, tr, cat(P, Q1), time.Time{}); !maps.Equal(got, want) {
		t.Fatalf("P+Q1: %v, want %v", got, want)
	}
	if got := matchMap(t, tr, cat(P, Q2), time.Time{}); got[0] != 100 {
		t.Fatalf("P+Q2: %v", got)
	}
	if st := tr.Stats(); st.Held[0] != 126 || st.Held[1] != 100 {
		t.Fatalf("held %v", st.Held)
	}
	tr.SetBudget(0, 60) // low water 54: what is left of Q1 goes, then Q2 but its first 4
	if got := matchMap(t, tr, cat(P, Q2), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 54, 1: 50}) {
		t.Fatalf("P+Q2 after budget 60: %v", got)
	}
	if got := matchMap(t, tr, cat(P, Q1), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 50, 1: 100}) {
		t.Fatalf("P+Q1 after budget 60: %v", got)
	}
	tr.SetBudget(0, 10) // low water 9: P itself does not fit and keeps its first 9
	if st := tr.Stats(); st.Held[0] != 9 || st.Held[1] != 100 {
		t.Fatalf("held %v", st.Held)
	}
	if got := matchMap(t, tr, cat(P, Q1), time.Time{}); !maps.Equal(got, map[ReplicaID]int{0: 9, 1: 100}) {
		t.Fatalf("P+Q1 after budget 10: %v", got)
	}
	mustValid(t, tr)
}

func TestBudgetDefaultAndReset(t *testing.T) {
	tr := New(Options{DefaultBudget: 1000})
	for i := range 50 {
		tr.Insert(seq(uint32(i)<<16, 100), 3, at(int64(i)))
		if h := tr.Stats().Held[3]; h > 1000 {
			t.Fatalf("insert %d: held %d > default budget", i, h)
		}
	}
	tr.SetBudget(3, 300)
	if h := tr.Stats().Held[3]; h > 300 {
		t.Fatalf("held %d > 300", h)
	}
	tr.SetBudget(3, 0) // back to the default
	for i := range 20 {
		tr.Insert(seq(1<<30+uint32(i)<<16, 100), 3, at(int64(100+i)))
	}
	if h := tr.Stats().Held[3]; h <= 300 || h > 1000 {
		t.Fatalf("held %d, want within (300, 1000] under the default budget", h)
	}
	// The most recent key survives.
	if got := matchMap(t, tr, seq(1<<30+19<<16, 100), time.Time{}); got[3] != 100 {
		t.Fatalf("latest key evicted: %v", got)
	}
	mustValid(t, tr)
}

// TestBudgetPerReplica floods one replica; the others keep everything.
func TestBudgetPerReplica(t *testing.T) {
	tr := New(Options{DefaultBudget: 100_000})
	tr.SetBudget(0, 500)
	shared := seq(1, 64)
	for i := range 200 {
		k := cat(shared, seq(uint32(i+1)<<16, 32))
		tr.Insert(k, ReplicaID(i%3), at(int64(i)))
	}
	st := tr.Stats()
	if st.Held[0] > 500 {
		t.Fatalf("replica 0 holds %d > 500", st.Held[0])
	}
	for r := ReplicaID(1); r < 3; r++ {
		want := int64(64 + 32*len(seqRange(200, int(r))))
		if st.Held[r] != want {
			t.Fatalf("replica %d holds %d, want %d", r, st.Held[r], want)
		}
	}
	mustValid(t, tr)
}

// seqRange returns the i in [0, n) with i%3 == r.
func seqRange(n, r int) []int {
	var out []int
	for i := r; i < n; i += 3 {
		out = append(out, i)
	}
	return out
}

// TestGlobalBytesBound floods the tree with unique keys from several replicas
// whose budgets are never reached: the byte bound alone must hold, and the
// globally least recently used keys must go first.
func TestGlobalBytesBound(t *testing.T) {
	const maxBytes = 64 << 10
	tr := New(Options{MaxBytes: maxBytes, DefaultBudget: 1 << 40})
	hot := seq(7, 200)
	var clock int64
	for i := range 2000 {
		clock++
		k := cat(seq(1<<24+uint32(i)<<8, 20), seq(uint32(i)<<12, 80))
		tr.Insert(k, ReplicaID(i%4), at(clock))
		if i%10 == 0 {
			clock++
			tr.Insert(hot, ReplicaID(i%4), at(clock)) // stays recently used
		}
		st := tr.Stats()
		if st.Bytes > maxBytes {
			t.Fatalf("insert %d: Bytes %d > %d", i, st.Bytes, maxBytes)
		}
		if got := matchMap(t, tr, k, time.Time{}); got[ReplicaID(i%4)] != len(k) {
			t.Fatalf("insert %d: newest key evicted: %v", i, got)
		}
	}
	if got := matchMap(t, tr, hot, time.Time{}); len(got) == 0 {
		t.Fatal("hot key evicted")
	}
	// The oldest keys are gone, the newest kept.
	if got := matchMap(t, tr, cat(seq(1<<24, 20), seq(0, 80)), time.Time{}); len(got) != 0 {
		t.Fatalf("oldest key kept: %v", got)
	}
	st := tr.Stats()
	if st.Bytes < maxBytes/2 {
		t.Fatalf("evicted far too much: %d bytes left", st.Bytes)
	}
	mustValid(t, tr)
}

// TestGlobalEvictionKeepsSharedPrefix: deleting old leaves must not take the
// shared, recently used prefix with them.
func TestGlobalEvictionKeepsSharedPrefix(t *testing.T) {
	tr := New(Options{MaxBytes: 20_000, DefaultBudget: 1 << 40})
	sys := seq(1, 500)
	for i := range 200 {
		tr.Insert(cat(sys, seq(uint32(i+1)<<16, 100)), ReplicaID(i%8), at(int64(i)))
		if b := tr.Stats().Bytes; b > 20_000 {
			t.Fatalf("bytes %d", b)
		}
	}
	got := matchMap(t, tr, sys, time.Time{})
	if len(got) != 8 {
		t.Fatalf("shared prefix lost holders: %v", got)
	}
	mustValid(t, tr)
}

func TestHugeKeyOverBudget(t *testing.T) {
	tr := New(Options{DefaultBudget: 1000})
	tr.Insert(seq(1, 100), 0, at(1))
	tr.Insert(seq(1000, 5000), 0, at(2)) // larger than the whole budget
	if st := tr.Stats(); st.Held[0] > 1000 {
		t.Fatalf("held %d", st.Held[0])
	}
	mustValid(t, tr)
}

// TestOldestFirstOrder checks the partial sort against a full sort, with many
// equal keys.
func TestOldestFirstOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{0, 1, 2, 3, 10, 300, 5000} {
		for _, spread := range []int64{1, 3, 1000} {
			lru := make([]lruEntry, n)
			for i := range lru {
				lru[i] = lruEntry{last: rng.Int64N(spread), depth: rng.IntN(4)}
			}
			want := slices.Clone(lru)
			slices.SortFunc(want, byAgeDeepestFirst)
			var got []lruEntry
			for e := range oldestFirst(lru) {
				got = append(got, e)
			}
			if len(got) != n {
				t.Fatalf("n=%d: yielded %d", n, len(got))
			}
			for i := range got {
				if byAgeDeepestFirst(got[i], want[i]) != 0 {
					t.Fatalf("n=%d spread=%d: position %d is %+v, want %+v", n, spread, i, got[i], want[i])
				}
			}
		}
	}
}

// TestEvictionWideFanout evicts thousands of leaves under one node: removal
// is deferred and compacted once per batch, so this stays fast, and the
// structure stays valid.
func TestEvictionWideFanout(t *testing.T) {
	tr := New(Options{MaxBytes: 2 << 20, DefaultBudget: 200_000})
	sys := seq(1, 32)
	rng := rand.New(rand.NewPCG(8, 8))
	key := make([]uint32, 0, 48)
	for i := range 60_000 {
		key = append(key[:0], sys...)
		for range 8 {
			key = append(key, 100+rng.Uint32N(1<<30))
		}
		tr.Insert(key, ReplicaID(i%4), at(int64(i)))
	}
	st := tr.Stats()
	if st.Bytes > 2<<20 {
		t.Fatalf("bytes %d", st.Bytes)
	}
	for r, h := range st.Held {
		if h > 200_000 {
			t.Fatalf("replica %d holds %d", r, h)
		}
	}
	if got := matchMap(t, tr, sys, time.Time{}); len(got) != 4 {
		t.Fatalf("shared prefix: %v", got)
	}
	mustValid(t, tr)
}
