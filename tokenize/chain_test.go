package tokenize

import (
	"slices"
	"testing"
)

// An exact key chains its blocks: a prompt extending another has its key
// as a prefix, the same tokens under another model share no value, and a
// Chain stepped block by block gives the same values as AppendExactKey.
func TestExactKey(t *testing.T) {
	toks := make([]uint32, 100)
	for i := range toks {
		toks[i] = uint32(i * 7)
	}
	k := AppendExactKey(nil, "m", toks, 16)
	if len(k) != 6 {
		t.Fatalf("%d values for 100 tokens in blocks of 16, want 6", len(k))
	}
	if short := AppendExactKey(nil, "m", toks[:50], 16); !slices.Equal(short, k[:3]) {
		t.Errorf("a prefix's key %v is not a prefix of %v", short, k)
	}
	other := AppendExactKey(nil, "n", toks, 16)
	for i := range k {
		if k[i] == other[i] {
			t.Errorf("block %d has the same value under two models", i)
		}
	}
	c := NewChain("m")
	for i := 0; i < 6; i++ {
		var v uint32
		c, v = c.Next(toks[16*i : 16*(i+1)])
		if v != k[i] {
			t.Errorf("step %d: %d, want %d", i, v, k[i])
		}
	}
	if AppendExactKey(nil, "m", toks, 0) != nil {
		t.Error("block 0 made a key")
	}
}
