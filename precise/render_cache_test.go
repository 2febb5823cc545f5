package precise

import (
	"slices"
	"testing"
	"time"
)

// TestRDCacheLearn: what rdCache.learn keeps under the key of a request's
// messages but the last, request by request, against the tokens the
// renders so far have in common.
func TestRDCacheLearn(t *testing.T) {
	seq := func(n int, tail ...uint32) []uint32 {
		s := make([]uint32, 0, n+len(tail))
		for i := range n {
			s = append(s, uint32(i)+1)
		}
		return append(s, tail...)
	}
	type step struct {
		conv   uint64 // the request's own conversation key
		toks   []uint32
		at     time.Duration
		stable bool
		kind   rdKind // what the parent key holds after (0 with shared 0: nothing)
		shared int    // tokens of the shared entry
		none   bool   // nothing held
	}
	const ttl = time.Minute
	cases := []struct {
		name  string
		steps []step
	}{
		{"a seed, then two conversations' common tokens", []step{
			{conv: 11, toks: seq(40, 900, 901), stable: true, kind: rdSeed},
			{conv: 12, toks: seq(40, 902), stable: true, kind: rdShared, shared: 40},
			{conv: 13, toks: seq(40, 903, 904), stable: true, kind: rdShared, shared: 40},
		}},
		{"the same messages again teach nothing", []step{
			{conv: 11, toks: seq(40, 900), stable: true, kind: rdSeed},
			{conv: 11, toks: seq(40, 900), stable: true, kind: rdSeed},
		}},
		{"a shared prefix run into the last messages is shortened", []step{
			{conv: 11, toks: seq(40, 7, 7, 900), stable: true, kind: rdSeed},
			{conv: 12, toks: seq(40, 7, 7, 901), stable: true, kind: rdShared, shared: 42},
			{conv: 13, toks: seq(40, 7, 902), stable: true, kind: rdShared, shared: 41}, // all but the last: stable
			{conv: 14, toks: seq(39, 903), stable: false, kind: rdShared, shared: 39},
		}},
		{"too little in common keeps nothing", []step{
			{conv: 11, toks: seq(20, 900), stable: true, kind: rdSeed},
			{conv: 12, toks: append(seq(10), 5, 5), stable: true, none: true},
			{conv: 13, toks: seq(20, 901), stable: true, kind: rdSeed},
		}},
		{"a shared prefix expires", []step{
			{conv: 11, toks: seq(40, 900), stable: true, kind: rdSeed},
			{conv: 12, toks: seq(40, 901), stable: true, kind: rdShared, shared: 40},
			{conv: 13, toks: seq(40, 902), at: 2 * ttl, stable: true, kind: rdSeed},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newRDCache(1<<20, ttl)
			const parent = 5
			for i, s := range tc.steps {
				k := rdKeys{conv: s.conv, body: s.conv * 7}
				k.prev[0] = parent
				now := s.at.Nanoseconds()
				if got := c.learn(&k, s.toks, now); got != s.stable {
					t.Fatalf("step %d: stable %v, want %v", i, got, s.stable)
				}
				e := c.get(parent, now)
				switch {
				case s.none && e != nil:
					t.Fatalf("step %d: %d kept, want nothing", i, e.Value.kind)
				case s.none:
				case e == nil || e.Value.kind != s.kind:
					t.Fatalf("step %d: %v, want kind %d", i, e, s.kind)
				case s.kind == rdShared && !slices.Equal(e.Value.toks, seq(40, 7, 7)[:s.shared]):
					t.Fatalf("step %d: shared %v, want the first %d", i, e.Value.toks, s.shared)
				}
				// Only a shared entry answers as an earlier turn would.
				q := rdKeys{conv: 99, body: 99}
				q.prev[0] = parent
				_, prev := c.lookup(&q, now)
				if (prev != nil) != (!s.none && s.kind == rdShared) {
					t.Fatalf("step %d: lookup found %v", i, prev)
				}
			}
		})
	}
}

// TestRDCacheSharedNotSuperseded: a render answered from a shared prefix
// does not drop it when stored, as a next turn drops its previous turn's
// entry; and an entry of exactly those messages is no seed.
func TestRDCacheSharedNotSuperseded(t *testing.T) {
	c := newRDCache(1<<20, time.Minute)
	toks := make([]uint32, 40)
	for i, conv := range []uint64{11, 12} {
		k := rdKeys{conv: conv, body: conv}
		k.prev[0] = 5
		toks[len(toks)-1] = uint32(i)
		c.learn(&k, slices.Clone(toks), 0)
	}
	k := rdKeys{conv: 13, body: 13}
	k.prev[0] = 5
	_, shared := c.lookup(&k, 0)
	if shared == nil || shared.kind != rdShared {
		t.Fatalf("no shared prefix: %v", shared)
	}
	c.store(&k, toks, shared, 0)
	q := rdKeys{conv: 14, body: 14}
	q.prev[0] = 5
	if _, again := c.lookup(&q, 0); again != shared {
		t.Fatalf("the shared prefix is gone: %v", again)
	}
	own := rdKeys{conv: 5, body: 5}
	c.store(&own, toks, nil, 0)
	if c.learn(&k, toks, 0); c.get(5, 0).Value.kind != rdTurn {
		t.Fatal("a request's own entry was taken for a seed")
	}
}
