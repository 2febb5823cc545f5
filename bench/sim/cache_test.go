package sim

import (
	"bytes"
	"testing"
	"time"
)

func TestCachePinnedNotEvicted(t *testing.T) {
	c := newKVCache(4)
	a := c.alloc()
	b := c.alloc()
	c.register(a, 1)
	c.register(b, 2)
	c.release(b) // b cached, a pinned
	if c.pinned != 1 || c.lruLen != 1 || c.free() != 2 || c.available() != 3 {
		t.Fatalf("pinned=%d lru=%d free=%d avail=%d", c.pinned, c.lruLen, c.free(), c.available())
	}
	for i := 0; i < 3; i++ {
		c.alloc()
	}
	if c.byKey[1] != a {
		t.Fatal("pinned block a was evicted")
	}
	if _, ok := c.byKey[2]; ok {
		t.Fatal("cached block b should have been evicted")
	}
	if c.available() != 0 || c.usage() != 1 {
		t.Fatalf("avail=%d usage=%v", c.available(), c.usage())
	}
}

func TestCacheLRUOrderAndHitRun(t *testing.T) {
	c := newKVCache(3)
	bl := []*kvBlock{c.alloc(), c.alloc(), c.alloc()}
	for i, b := range bl {
		c.register(b, uint64(10+i))
	}
	// Release 2, 0, 1: LRU order 2 (oldest), 0, 1.
	c.release(bl[2])
	c.release(bl[0])
	c.release(bl[1])
	if got := c.lookup([]uint64{10, 11, 12}, 3); len(got) != 3 {
		t.Fatalf("lookup = %d blocks, want 3", len(got))
	}
	c.alloc() // evicts key 12
	if got := c.lookup([]uint64{10, 11, 12}, 3); len(got) != 2 {
		t.Fatalf("lookup = %d blocks, want 2", len(got))
	}
	c.alloc() // evicts key 10: the run breaks at block 0
	if got := c.lookup([]uint64{10, 11, 12}, 3); len(got) != 0 {
		t.Fatalf("lookup = %d blocks, want 0 (leading run only)", len(got))
	}
	// Re-pinning a cached block takes it off the LRU list.
	b11 := c.byKey[11]
	c.pin(b11)
	if c.lruLen != 0 || c.pinned != 3 {
		t.Fatalf("lru=%d pinned=%d", c.lruLen, c.pinned)
	}
	// A duplicate registration leaves the second block anonymous.
	d := newKVCache(2)
	x, y := d.alloc(), d.alloc()
	d.register(x, 7)
	d.register(y, 7)
	d.release(y)
	if d.lruLen != 0 || d.free() != 1 {
		t.Fatalf("duplicate block should be freed, lru=%d free=%d", d.lruLen, d.free())
	}
}

func TestBlockKeysChained(t *testing.T) {
	bb := 16 * BytesPerToken
	p := bytes.Repeat([]byte("a"), 3*bb+5)
	k := blockKeys(p, 16)
	if len(k) != 3 {
		t.Fatalf("%d keys, want 3 whole blocks", len(k))
	}
	q := append([]byte(nil), p...)
	q[bb+1] = 'b' // change block 1
	k2 := blockKeys(q, 16)
	if k[0] != k2[0] || k[1] == k2[1] || k[2] == k2[2] {
		t.Fatalf("chain: %x vs %x", k, k2)
	}
	if k[1] == k[2] {
		t.Fatal("identical block bytes at different depths must get different keys")
	}
	if numTokens(5) != 2 || numTokens(8) != 2 || numTokens(0) != 0 {
		t.Fatal("numTokens")
	}
}

func TestPresetCostModel(t *testing.T) {
	cfg := Config{Preset: "llama-8b-h100"}
	near := func(name string, got time.Duration, lo, hi float64) {
		t.Helper()
		ms := float64(got) / float64(time.Millisecond)
		if ms < lo || ms > hi {
			t.Errorf("%s = %.2f ms, want in [%v, %v]", name, ms, lo, hi)
		}
	}
	near("8b decode 1x1k", cfg.DecodeStepTime(1, 1024), 7, 8)
	near("8b decode 64x2k", cfg.DecodeStepTime(64, 64*2048), 13.5, 15)
	near("8b decode 64x4k", cfg.DecodeStepTime(64, 64*4096), 18, 21)
	near("8b prefill 2k", cfg.PrefillTime(2048, 0, 0), 60, 75) // ~30k tok/s
	q := Config{Preset: "qwen-32b-2xh100"}
	near("32b decode 1", q.DecodeStepTime(1, 1024), 11, 14)
	near("32b prefill 2k", q.PrefillTime(2048, 0, 0), 80, 100)
	if p, err := PresetConfig("qwen-32b-2xh100"); err != nil || p.NumGPUBlocks*p.BlockSize != 307328 {
		t.Fatalf("qwen capacity: %+v %v", p, err)
	}
	if p, _ := PresetConfig("llama-8b-h100"); p.NumGPUBlocks*p.BlockSize != 400000 {
		t.Fatalf("llama capacity %d", p.NumGPUBlocks*p.BlockSize)
	}
	if _, err := PresetConfig("nope"); err == nil {
		t.Fatal("unknown preset accepted")
	}
	if len(Presets()) < 2 {
		t.Fatal("presets")
	}
}
