package lru

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the naive cache a Cache must behave as: a slice of entries,
// most recently used first, each costing its value.
type model struct {
	es       []modelEntry
	maxN     int
	maxCost  int64
	evicted  []int64
	withCost bool
}

type modelEntry struct {
	k int
	v int64
}

func (m *model) find(k int) int {
	return slices.IndexFunc(m.es, func(e modelEntry) bool { return e.k == k })
}

func (m *model) cost() int64 {
	if !m.withCost {
		return 0
	}
	var c int64
	for _, e := range m.es {
		c += e.v
	}
	return c
}

func (m *model) evict() {
	for len(m.es) > 0 && (m.maxN > 0 && len(m.es) > m.maxN || m.maxCost > 0 && m.cost() > m.maxCost) {
		m.evicted = append(m.evicted, m.es[len(m.es)-1].v)
		m.es = m.es[:len(m.es)-1]
	}
}

func (m *model) put(k int, v int64) bool {
	if m.withCost && m.maxCost > 0 && v > m.maxCost {
		return false
	}
	if i := m.find(k); i >= 0 {
		m.es = slices.Delete(m.es, i, i+1)
	} else if m.maxN > 0 && len(m.es) >= m.maxN {
		m.evicted = append(m.evicted, m.es[len(m.es)-1].v)
		m.es = m.es[:len(m.es)-1]
	}
	m.es = slices.Insert(m.es, 0, modelEntry{k, v})
	m.evict()
	return true
}

// order returns c's entries, most recently used first.
func order(c *Cache[int, int64]) []modelEntry {
	var out []modelEntry
	for e := c.root.next; e != &c.root; e = e.next {
		out = append(out, modelEntry{e.key, e.Value})
	}
	return out
}

// A Cache agrees with the naive model on its entries, their order, its
// cost and what it evicted, over random sequences of every operation and
// bound changes, bounded by entries, by cost, by both or by neither.
func TestCacheMatchesNaiveModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 11))
		m := &model{maxN: rng.IntN(8), maxCost: int64(rng.IntN(40)), withCost: rng.IntN(2) == 0}
		var evicted []int64
		o := Options[int64]{MaxEntries: m.maxN, MaxCost: m.maxCost, Evicted: func(v *int64) { evicted = append(evicted, *v) }}
		if m.withCost {
			o.Cost = func(v int64) int64 { return v }
		}
		var c Cache[int, int64]
		c.Init(o)
		for step := range 400 {
			k, v := rng.IntN(12), int64(1+rng.IntN(15))
			switch op := rng.IntN(100); {
			case op < 35:
				got := c.Put(k, v) != nil
				if want := m.put(k, v); got != want {
					t.Fatalf("seed %d step %d: Put(%d, %d) stored %v, model %v", seed, step, k, v, got, want)
				}
			case op < 45:
				e := &Entry[int, int64]{Value: v}
				got := c.PutEntry(k, e) == e
				if want := m.put(k, v); got != want {
					t.Fatalf("seed %d step %d: PutEntry(%d, %d) stored %v, model %v", seed, step, k, v, got, want)
				}
			case op < 60:
				e, i := c.Peek(k), m.find(k)
				if (e != nil) != (i >= 0) || e != nil && e.Value != m.es[i].v {
					t.Fatalf("seed %d step %d: Peek(%d) = %v, model index %d", seed, step, k, e, i)
				}
			case op < 75:
				e, i := c.Get(k), m.find(k)
				if (e != nil) != (i >= 0) {
					t.Fatalf("seed %d step %d: Get(%d) found %v, model index %d", seed, step, k, e != nil, i)
				}
				if i >= 0 {
					me := m.es[i]
					m.es = slices.Insert(slices.Delete(m.es, i, i+1), 0, me)
				}
			case op < 82:
				if e := c.Peek(k); e != nil {
					c.Remove(e)
					i := m.find(k)
					m.es = slices.Delete(m.es, i, i+1)
				}
			case op < 88:
				limit, odd := rng.IntN(4)-1, func(v int64) bool { return v%2 == 1 }
				got := c.RemoveOldestWhile(limit, func(e *Entry[int, int64]) bool { return odd(e.Value) })
				want := 0
				for len(m.es) > 0 && want != limit && odd(m.es[len(m.es)-1].v) {
					m.es = m.es[:len(m.es)-1]
					want++
				}
				if got != want {
					t.Fatalf("seed %d step %d: RemoveOldestWhile removed %d, model %d", seed, step, got, want)
				}
			case op < 93:
				got := c.RemoveFunc(func(e *Entry[int, int64]) bool { return e.Value == v })
				n := len(m.es)
				m.es = slices.DeleteFunc(m.es, func(e modelEntry) bool { return e.v == v })
				if want := n - len(m.es); got != want {
					t.Fatalf("seed %d step %d: RemoveFunc removed %d, model %d", seed, step, got, want)
				}
			default:
				m.maxN, m.maxCost = rng.IntN(8), int64(rng.IntN(40))
				c.SetBounds(m.maxN, m.maxCost)
				m.evict()
			}
			if got := order(&c); !slices.Equal(got, m.es) {
				t.Fatalf("seed %d step %d: entries %v, model %v", seed, step, got, m.es)
			}
			if c.Len() != len(m.es) || c.Cost() != m.cost() || !slices.Equal(evicted, m.evicted) {
				t.Fatalf("seed %d step %d: len %d cost %d evicted %v, model %d %d %v", seed, step, c.Len(), c.Cost(), evicted, len(m.es), m.cost(), m.evicted)
			}
			if old, i := c.Oldest(), len(m.es)-1; (old != nil) != (i >= 0) || old != nil && old.Key() != m.es[i].k {
				t.Fatalf("seed %d step %d: Oldest %v, model %v", seed, step, old, m.es)
			}
		}
	}
}

// A new key at the entry bound reuses the entry it drops: Put allocates
// nothing once the Cache is full, and neither do Get and Touch.
func TestCachePutAtBoundAllocatesNothing(t *testing.T) {
	var c Cache[int, [2]uint64]
	c.Init(Options[[2]uint64]{MaxEntries: 64})
	for i := range 64 {
		c.Put(i, [2]uint64{uint64(i)})
	}
	i := 64
	if n := testing.AllocsPerRun(1000, func() {
		c.Put(i, [2]uint64{uint64(i)})
		c.Get(i - 10)
		i++
	}); n != 0 {
		t.Errorf("Put at the bound allocated %.1f times, want 0", n)
	}
}

// BenchmarkCache times Get of a held key and Put of a new key at the
// bound.
func BenchmarkCache(b *testing.B) {
	const n = 4096
	var c Cache[uint64, [2]uint64]
	c.Init(Options[[2]uint64]{MaxEntries: n})
	for i := range uint64(n) {
		c.Put(i, [2]uint64{i})
	}
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		for i := uint64(0); b.Loop(); i++ {
			if c.Get(i%n) == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("put-new", func(b *testing.B) {
		b.ReportAllocs()
		for i := uint64(n); b.Loop(); i++ {
			c.Put(i, [2]uint64{i})
		}
	})
}
