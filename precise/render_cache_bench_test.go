package precise

import (
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/liveheap"
)

// BenchmarkRenderCache times the render cache on a full cache: a lookup
// that hits, and a store of a new conversation, which drops the least
// recently used.
func BenchmarkRenderCache(b *testing.B) {
	const n, toks = 4096, 64
	size := int64(toks*4 + rdEntryOverhead)
	keys := func(i int) *rdKeys { return &rdKeys{conv: uint64(i) + 1, body: uint64(i) * 7} }
	fill := func() *rdCache {
		c := newRDCache(n*size, time.Hour)
		for i := range n {
			c.store(keys(i), make([]uint32, toks), nil, 0)
		}
		return c
	}
	b.Run("lookup", func(b *testing.B) {
		c := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if hit, _ := c.lookup(keys(i%n), 1); hit == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("store-new", func(b *testing.B) {
		c := fill()
		tokens := make([]uint32, toks)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			c.store(keys(n+i), tokens, nil, 1)
		}
	})
}

// TestRenderCacheBytesPerEntry logs the heap an entry takes beyond its
// tokens, against rdEntryOverhead.
func TestRenderCacheBytesPerEntry(t *testing.T) {
	const n = 100000
	c := newRDCache(1<<40, time.Hour)
	toks := make([]uint32, 8)
	keys := make([]rdKeys, n)
	for i := range keys {
		keys[i] = rdKeys{conv: uint64(i) + 1, body: uint64(i)}
	}
	per := liveheap.PerEntry(n, func() {
		for i := range keys {
			c.store(&keys[i], toks, nil, 0) // tokens shared: the entries alone are counted
		}
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(keys) // else freed meanwhile, and subtracted
	t.Logf("render cache entry beyond its tokens: %.1f B (rdEntryOverhead %d)", per, rdEntryOverhead)
}
