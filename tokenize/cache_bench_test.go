package tokenize

import (
	"runtime"
	"testing"

	"github.com/kvroute/kvroute/internal/liveheap"
)

// BenchmarkTokenCache times the token cache on a full cache: a find that
// hits, a put of a new message, and a putConversation of a new
// conversation, each of which drops the least recently used.
func BenchmarkTokenCache(b *testing.B) {
	const n, toks = 1 << 14, 32
	key := func(i int) key128 { return key128{a: uint64(i) * 0x9e3779b97f4a7c15, b: uint64(i)} }
	tokens := make([]uint32, toks)
	fill := func() *tokenCache {
		c := newTokenCache(n * entryCost(toks))
		for i := range n {
			c.put(kindMessage, key(i), tokens)
		}
		return c
	}
	b.Run("find", func(b *testing.B) {
		c := fill()
		b.ReportAllocs()
		hits := 0
		for i := 0; b.Loop(); i++ {
			if _, _, ok := c.find(kindMessage, key(i%n)); ok {
				hits++
			}
		}
		if hits == 0 {
			b.Fatal("no hit")
		}
	})
	b.Run("put-new", func(b *testing.B) {
		c := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			c.put(kindMessage, key(n+i), tokens)
		}
	})
	b.Run("conversation-new", func(b *testing.B) {
		c := fill()
		tail := make([]uint32, 5)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			c.putConversation(key(n+i), tokens, 1, toks+len(tail), tail)
		}
	})
}

// TestTokenCacheBytesPerEntry logs the heap a message entry and a
// conversation entry take beyond their tokens, against entryOverhead and
// convTailBytes.
func TestTokenCacheBytesPerEntry(t *testing.T) {
	const n = 100000
	key := func(i int) key128 { return key128{a: uint64(i) * 0x9e3779b97f4a7c15, b: uint64(i)} }
	blocks := make([]uint32, 16)
	c := newTokenCache(1 << 40)
	perConv := liveheap.PerEntry(n, func() {
		for i := range n {
			c.putConversation(key(i), blocks, 1, 20, blocks[:4]) // blocks shared: the entries alone are counted
		}
	})
	c2 := newTokenCache(1 << 40)
	perMsg := liveheap.PerEntry(n, func() {
		for i := range n {
			c2.put(kindMessage, key(i), nil)
		}
	})
	runtime.KeepAlive(c)
	runtime.KeepAlive(c2)
	t.Logf("token cache: message entry %.1f B (entryOverhead %d), conversation entry %.1f B (entryOverhead+convTailBytes %d)",
		perMsg, entryOverhead, perConv, entryOverhead+convTailBytes)
}
