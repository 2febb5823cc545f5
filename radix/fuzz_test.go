package radix

import (
	"maps"
	"testing"
	"time"
)

// byteReader hands out fuzz input one byte at a time, then zeros.
type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) next() int {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return int(r.b[r.i-1])
}

func (r *byteReader) done() bool { return r.i >= len(r.b) }

// FuzzTreeOps decodes its input into a sequence of insert, match, undo,
// remove-replica, evict-before and touch operations over four replicas and a
// three-token alphabet, with a clock that often stands still (so merges of
// equal-time nodes happen). Budgets and the byte bound are never reached, so
// the naive model is exact: every result, the per-replica held counts, the
// stored token count and the tree's structural invariants are checked after
// every operation.
func FuzzTreeOps(f *testing.F) {
	f.Add([]byte{0, 1, 0, 5, 0, 1, 2, 0, 1, 1, 0, 3, 0, 1, 2, 1, 2, 0, 1, 0, 5, 0, 1, 2})
	f.Add([]byte{0, 0, 1, 9, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 1, 0, 4, 2, 2, 1, 1, 3, 0, 1, 9, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3})
	f.Add([]byte{1, 2, 1, 6, 0, 1, 2, 0, 1, 2, 1, 3, 1, 7, 0, 1, 2, 0, 1, 2, 0, 5, 0, 0, 1, 4, 3, 0, 2, 0, 1, 2, 5, 0, 2, 1})
	f.Add([]byte("kvroute radix fuzz seed with a few more bytes to decode"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &byteReader{b: data}
		tr := New(Options{MaxBytes: 1 << 40, DefaultBudget: 1 << 40})
		m := newModel()
		var clock int64
		readKey := func() []uint32 {
			k := make([]uint32, in.next()%10)
			for i := range k {
				k[i] = uint32(in.next() % 3)
			}
			return k
		}
		for step := 0; step < 300 && !in.done(); step++ {
			op := in.next() % 7
			r := ReplicaID(in.next() % 4)
			clock += int64(in.next() % 3)
			switch op {
			case 0, 1:
				k := readKey()
				got, want := tr.Insert(k, r, at(clock)), m.insert(k, r, clock)
				if got != want {
					t.Fatalf("step %d: Insert(%v, %d) = %d, want %d", step, k, r, got, want)
				}
			case 2:
				k := readKey()
				nb, nbc := time.Time{}, int64(-1<<62)
				if d := in.next() % 4; d > 0 {
					nbc = clock - int64(d-1)
					nb = at(nbc)
				}
				if got, want := matchMap(t, tr, k, nb), m.match(k, nbc); !maps.Equal(got, want) {
					t.Fatalf("step %d: Match(%v, %d) = %v, want %v", step, k, nbc, got, want)
				}
				continue
			case 3:
				k := readKey()
				keep := in.next() % (len(k) + 1)
				tr.Undo(k, r, keep)
				m.undo(k, r, keep)
			case 4:
				tr.RemoveReplica(r)
				m.remove(r)
			case 5:
				cut := clock - int64(in.next()%8)
				if got, want := tr.EvictBefore(at(cut)), m.evictBefore(cut); got != want {
					t.Fatalf("step %d: EvictBefore released %d, want %d", step, got, want)
				}
			case 6:
				k := readKey()
				if got, want := tr.Touch(k, r, at(clock)), m.touch(k, r, clock); got != want {
					t.Fatalf("step %d: Touch(%v, %d) = %d, want %d", step, k, r, got, want)
				}
			}
			if err := checkInvariants(tr); err != nil {
				t.Fatalf("step %d (op %d): %v", step, op, err)
			}
			st := tr.Stats()
			if want := m.heldTokens(); !maps.Equal(st.Held, want) {
				t.Fatalf("step %d (op %d): Held %v, want %v", step, op, st.Held, want)
			}
			if want := m.unionTokens(); st.Tokens != want {
				t.Fatalf("step %d (op %d): Tokens %d, want %d", step, op, st.Tokens, want)
			}
		}
	})
}
