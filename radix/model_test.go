package radix

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// model is the naive reference: for each replica, the set of prefixes it
// holds (every length from 1 up), each with its last-used time. It is exact
// as long as no budget or byte bound evicts anything.
type model struct {
	held map[ReplicaID]map[string]int64
}

func newModel() *model { return &model{held: map[ReplicaID]map[string]int64{}} }

// enc encodes tokens as 4 big-endian bytes each, so string prefixes are token
// prefixes.
func enc(k []uint32) string {
	b := make([]byte, 4*len(k))
	for i, v := range k {
		binary.BigEndian.PutUint32(b[4*i:], v)
	}
	return string(b)
}

func (m *model) insert(key []uint32, r ReplicaID, ts int64) int {
	s := enc(key)
	set := m.held[r]
	if set == nil {
		set = map[string]int64{}
		m.held[r] = set
	}
	already := 0
	for l := 1; l <= len(key); l++ {
		if _, ok := set[s[:4*l]]; !ok {
			break
		}
		already = l
	}
	for l := 1; l <= len(key); l++ {
		p := s[:4*l]
		if old, ok := set[p]; !ok || ts > old {
			set[p] = ts
		}
	}
	return already
}

// touch refreshes the prefixes of key r holds, shortest first, up to the
// first it does not hold, and returns how many it held.
func (m *model) touch(key []uint32, r ReplicaID, ts int64) int {
	s, set := enc(key), m.held[r]
	l := 0
	for ; l < len(key); l++ {
		old, ok := set[s[:4*(l+1)]]
		if !ok {
			break
		}
		set[s[:4*(l+1)]] = max(old, ts)
	}
	return l
}

func (m *model) match(key []uint32, nb int64) map[ReplicaID]int {
	s := enc(key)
	out := map[ReplicaID]int{}
	for r, set := range m.held {
		best := 0
		for l := 1; l <= len(key); l++ {
			ts, ok := set[s[:4*l]]
			if !ok || ts < nb {
				break
			}
			best = l
		}
		if best > 0 {
			out[r] = best
		}
	}
	return out
}

func (m *model) undo(key []uint32, r ReplicaID, keep int) {
	s := enc(key)
	for p := range m.held[r] {
		n := min(len(p), len(s))
		i := 0
		for i < n && p[i] == s[i] {
			i++
		}
		if i/4 > keep {
			delete(m.held[r], p)
		}
	}
}

func (m *model) remove(r ReplicaID) { delete(m.held, r) }

func (m *model) evictBefore(cut int64) int {
	n := 0
	for _, set := range m.held {
		for p, ts := range set {
			if ts < cut {
				delete(set, p)
				n++
			}
		}
	}
	return n
}

func (m *model) heldTokens() map[ReplicaID]int64 {
	out := map[ReplicaID]int64{}
	for r, set := range m.held {
		if len(set) > 0 {
			out[r] = int64(len(set))
		}
	}
	return out
}

func (m *model) unionTokens() int64 {
	u := map[string]bool{}
	for _, set := range m.held {
		for p := range set {
			u[p] = true
		}
	}
	return int64(len(u))
}

// matchMap runs MatchInto and returns its result as a map, failing on a
// duplicate or empty entry.
func matchMap(tb testing.TB, tr *Tree, key []uint32, nb time.Time) map[ReplicaID]int {
	tb.Helper()
	out := map[ReplicaID]int{}
	for _, m := range tr.MatchInto(nil, key, nb) {
		if _, dup := out[m.Replica]; dup {
			tb.Fatalf("replica %d reported twice", m.Replica)
		}
		if m.Tokens <= 0 || m.Tokens > len(key) {
			tb.Fatalf("replica %d: Tokens %d out of range (key len %d)", m.Replica, m.Tokens, len(key))
		}
		out[m.Replica] = m.Tokens
	}
	return out
}

// checkInvariants verifies the tree's structure and counters.
func checkInvariants(tr *Tree) error {
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	if tr.root.parent != nil || len(tr.root.label) != 0 || len(tr.root.holders) != 0 {
		return fmt.Errorf("bad root")
	}
	var nodes int
	var tokens, spare, entries, indexed int64
	held := make([]int64, len(tr.held))
	stack := []*node{tr.root}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if x.index != nil && (len(x.index) != len(x.children) || len(x.children) <= indexAt/2) {
			return fmt.Errorf("index of %d entries on a node with %d children", len(x.index), len(x.children))
		}
		if x.index == nil && len(x.children) > indexAt {
			return fmt.Errorf("%d children without an index", len(x.children))
		}
		indexed += int64(len(x.index))
		for i, e := range x.children {
			c := e.n
			if c.parent != x {
				return fmt.Errorf("bad parent pointer")
			}
			if len(c.label) == 0 {
				return fmt.Errorf("empty label")
			}
			if e.tok != c.label[0] {
				return fmt.Errorf("edge token %d, label starts with %d", e.tok, c.label[0])
			}
			if x.index == nil && i > 0 && x.children[i-1].tok >= e.tok {
				return fmt.Errorf("children not sorted/unique by first token")
			}
			if x.index != nil && x.index[e.tok] != int32(i) {
				return fmt.Errorf("child %d with first token %d indexed at %d", i, e.tok, x.index[e.tok])
			}
			if len(c.holders) == 0 {
				return fmt.Errorf("node without holders")
			}
			for j, h := range c.holders {
				if j > 0 && c.holders[j-1].r >= h.r {
					return fmt.Errorf("holders not sorted/unique")
				}
				if x != tr.root {
					pj, ok := x.holderIndex(h.r)
					if !ok {
						return fmt.Errorf("replica %d holds child but not parent", h.r)
					}
					if x.holders[pj].last < h.last {
						return fmt.Errorf("replica %d: child newer than parent", h.r)
					}
				}
				if int(h.r) >= len(held) {
					return fmt.Errorf("replica %d out of range", h.r)
				}
				held[h.r] += int64(len(c.label))
			}
			nodes++
			tokens += int64(len(c.label))
			spare += slack(c.label)
			entries += int64(len(c.holders))
			stack = append(stack, c)
		}
	}
	if nodes != tr.nodes || tokens != tr.tokens || spare != tr.spare || entries != tr.holderEntries || indexed != tr.indexed {
		return fmt.Errorf("counters: nodes %d/%d tokens %d/%d spare %d/%d entries %d/%d indexed %d/%d",
			nodes, tr.nodes, tokens, tr.tokens, spare, tr.spare, entries, tr.holderEntries, indexed, tr.indexed)
	}
	if !slices.Equal(held, tr.held) {
		return fmt.Errorf("held: walked %v, counted %v", held, tr.held)
	}
	return nil
}

var epoch = time.Unix(1_700_000_000, 0)

func at(clock int64) time.Time { return epoch.Add(time.Duration(clock)) }

// keyGen makes keys that share prefixes: mostly an earlier key's prefix plus a
// short random tail, over a small alphabet.
type keyGen struct {
	rng      *rand.Rand
	alphabet uint32
	maxLen   int
	pool     [][]uint32
}

func (g *keyGen) next() []uint32 {
	var k []uint32
	if len(g.pool) > 0 && g.rng.IntN(4) != 0 {
		base := g.pool[g.rng.IntN(len(g.pool))]
		k = slices.Clone(base[:g.rng.IntN(len(base)+1)])
	}
	for n := g.rng.IntN(g.maxLen/2 + 1); n > 0 && len(k) < g.maxLen; n-- {
		k = append(k, g.rng.Uint32N(g.alphabet))
	}
	if len(k) == 0 {
		k = append(k, g.rng.Uint32N(g.alphabet))
	}
	if len(g.pool) < 64 {
		g.pool = append(g.pool, k)
	} else {
		g.pool[g.rng.IntN(len(g.pool))] = k
	}
	return k
}

// wideGen returns, for seeds from 20 on, a generator of short keys over an
// alphabet wider than indexAt, so that nodes index their children and drop
// the index again as children come and go; below 20, nil.
func wideGen(rng *rand.Rand, seed uint64) *keyGen {
	if seed < 20 {
		return nil
	}
	return &keyGen{rng: rng, alphabet: indexAt + 8 + uint32(seed%4)*16, maxLen: 3 + int(seed%3)}
}

// TestRandomOpsAgainstModel runs random insert/match/undo/remove/evict-before
// sequences without budget pressure and requires exact agreement with the
// model after every step. Seeds from 20 on make wide nodes.
func TestRandomOpsAgainstModel(t *testing.T) {
	for seed := range uint64(28) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			gen := &keyGen{rng: rng, alphabet: 2 + uint32(seed%4), maxLen: 4 + int(seed%5)*6}
			if w := wideGen(rng, seed); w != nil {
				gen = w
			}
			tr := New(Options{})
			m := newModel()
			var clock int64
			type rec struct {
				key  []uint32
				r    ReplicaID
				keep int
			}
			var recs []rec
			for step := range 1500 {
				clock += rng.Int64N(3) // equal times happen and exercise merges
				r := ReplicaID(rng.IntN(5))
				op := rng.IntN(100)
				desc := ""
				switch {
				case op < 45:
					k := gen.next()
					got := tr.Insert(k, r, at(clock))
					want := m.insert(k, r, clock)
					if got != want {
						t.Fatalf("step %d: Insert(%v, %d) = %d, want %d", step, k, r, got, want)
					}
					recs = append(recs, rec{k, r, got})
					desc = fmt.Sprintf("insert %v r%d", k, r)
				case op < 70:
					k := gen.next()
					nb := time.Time{}
					nbc := int64(-1 << 62)
					if rng.IntN(2) == 0 {
						nbc = clock - rng.Int64N(clock+1)
						nb = at(nbc)
					}
					got := matchMap(t, tr, k, nb)
					want := m.match(k, nbc)
					if !maps.Equal(got, want) {
						t.Fatalf("step %d: Match(%v, %d) = %v, want %v", step, k, nbc, got, want)
					}
					continue
				case op < 85 && len(recs) > 0:
					i := rng.IntN(len(recs))
					rc := recs[i]
					recs = slices.Delete(recs, i, i+1)
					keep := rc.keep
					if rng.IntN(4) == 0 {
						keep = rng.IntN(len(rc.key) + 1)
					}
					tr.Undo(rc.key, rc.r, keep)
					m.undo(rc.key, rc.r, keep)
					desc = fmt.Sprintf("undo %v r%d keep %d", rc.key, rc.r, keep)
				case op < 90:
					tr.RemoveReplica(r)
					m.remove(r)
					desc = fmt.Sprintf("remove r%d", r)
				case op < 95:
					cut := clock - rng.Int64N(40)
					got := tr.EvictBefore(at(cut))
					want := m.evictBefore(cut)
					if got != want {
						t.Fatalf("step %d: EvictBefore released %d, want %d", step, got, want)
					}
					desc = fmt.Sprintf("evict-before %d", cut)
				default:
					k := gen.next()
					if got, want := tr.Touch(k, r, at(clock)), m.touch(k, r, clock); got != want {
						t.Fatalf("step %d: Touch(%v, %d) = %d, want %d", step, k, r, got, want)
					}
					desc = fmt.Sprintf("touch %v r%d", k, r)
				}
				if err := checkInvariants(tr); err != nil {
					t.Fatalf("step %d after %s: %v", step, desc, err)
				}
				st := tr.Stats()
				if want := m.heldTokens(); !maps.Equal(st.Held, want) {
					t.Fatalf("step %d after %s: Held %v, want %v", step, desc, st.Held, want)
				}
				if want := m.unionTokens(); st.Tokens != want {
					t.Fatalf("step %d after %s: Tokens %d, want %d", step, desc, st.Tokens, want)
				}
			}
			// Final sweep: every pooled key matches the model.
			for _, k := range gen.pool {
				if got, want := matchMap(t, tr, k, time.Time{}), m.match(k, -1<<62); !maps.Equal(got, want) {
					t.Fatalf("final Match(%v) = %v, want %v", k, got, want)
				}
			}
		})
	}
}

// TestRandomOpsWithEviction adds budget and byte pressure. The model then
// over-approximates the tree: every tree match must be at most the model's,
// budgets and the byte bound must hold after every step. Seeds from 20 on
// make wide nodes.
func TestRandomOpsWithEviction(t *testing.T) {
	for seed := range uint64(26) {
		if seed >= 12 && seed < 20 {
			continue
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			gen := &keyGen{rng: rng, alphabet: 3, maxLen: 30}
			if w := wideGen(rng, seed); w != nil {
				gen = w
			}
			maxBytes := int64(0)
			if seed%2 == 1 {
				maxBytes = 4000 + int64(seed)*500
			}
			tr := New(Options{MaxBytes: maxBytes, DefaultBudget: 60})
			budgets := map[ReplicaID]int64{}
			m := newModel()
			var clock int64
			for step := range 2000 {
				clock += 1 + rng.Int64N(2)
				r := ReplicaID(rng.IntN(4))
				k := gen.next()
				switch op := rng.IntN(100); {
				case op < 50:
					got := tr.Insert(k, r, at(clock))
					want := m.insert(k, r, clock)
					if got > want {
						t.Fatalf("step %d: Insert already %d > model %d", step, got, want)
					}
				case op < 80:
					got := matchMap(t, tr, k, time.Time{})
					want := m.match(k, -1<<62)
					for rr, n := range got {
						if n > want[rr] {
							t.Fatalf("step %d: replica %d matched %d > model %d", step, rr, n, want[rr])
						}
					}
				case op < 85:
					// Undo only removes from the tree, so the tree stays a
					// subset of the model without replaying it there.
					tr.Undo(k, r, rng.IntN(len(k)+1))
				case op < 90:
					b := 20 + rng.Int64N(100)
					tr.SetBudget(r, b)
					budgets[r] = b
				case op < 93:
					tr.RemoveReplica(r)
					m.remove(r)
				default:
					tr.EvictBefore(at(clock - 50))
					m.evictBefore(clock - 50)
				}
				if err := checkInvariants(tr); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				st := tr.Stats()
				for rr, h := range st.Held {
					b, ok := budgets[rr]
					if !ok {
						b = 60
					}
					if h > b {
						t.Fatalf("step %d: replica %d holds %d > budget %d", step, rr, h, b)
					}
				}
				if maxBytes > 0 && st.Bytes > maxBytes {
					t.Fatalf("step %d: Bytes %d > MaxBytes %d", step, st.Bytes, maxBytes)
				}
			}
		})
	}
}
