package tokenize

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// refBlocks is the block key by its definition: toks cut into whole blocks,
// each hashed onto the chain started from the model.
func refBlocks(model string, toks []uint32, block int) []uint32 {
	h := modelSeed(model)
	var out []uint32
	for i := 0; i+block <= len(toks); i += block {
		h = hashBlock(h, toks[i:i+block])
		out = append(out, blockValue(h))
	}
	return out
}

// checkBlocks checks tk's block key of req against the definition applied
// to the uncached tokenizer's key.
func checkBlocks(tb testing.TB, tk, plain *Tokenizer, req *oai.Request) {
	tb.Helper()
	toks := plain.Key(nil, req)
	got, tokens := tk.Blocks(nil, req)
	if want := refBlocks(req.Model, toks, tk.KeyBlock()); !slices.Equal(got, want) {
		tb.Fatalf("%d messages: block key of %d values differs from the %d values of the definition", len(req.Messages), len(got), len(want))
	}
	if tokens != len(toks) {
		tb.Fatalf("%d messages: %d tokens reported, the key has %d", len(req.Messages), tokens, len(toks))
	}
}

func TestBlocksMatchDefinition(t *testing.T) {
	msgs := conversation(10)
	tools := `[{"type":"function","function":{"name":"lookup"}}]`
	reqs := []*oai.Request{
		{Kind: oai.KindCompletion, Model: "m", Prompt: oai.Prompt{Texts: []string{genDoc(1, 5000)}}},
		{Kind: oai.KindEmbedding, Prompt: oai.Prompt{Texts: []string{"a", "b c", genDoc(2, 3000)}}},
		{Kind: oai.KindGenerate, Prompt: oai.Prompt{Tokens: [][]uint32{{1, 2, 3}, {4}}}},
		{Kind: oai.KindChat, Model: "m", Messages: msgs[:1]},
	}
	for n := 2; n <= len(msgs); n++ {
		reqs = append(reqs, &oai.Request{Kind: oai.KindChat, Model: "m", Tools: tools, Messages: msgs[:n]})
	}
	for _, block := range []int{1, 7, 16, 64} {
		for _, cache := range []int64{0, -1, 8 << 10} {
			opts := Options{KeyBlock: block, CacheBytes: cache}
			t.Run(fmt.Sprintf("block=%d/cache=%d", block, cache), func(t *testing.T) {
				tk := newTok(t, opts)
				plain := newTok(t, Options{CacheBytes: -1})
				// Twice: cold, then with every conversation turn cached.
				for range 2 {
					for _, req := range reqs {
						checkBlocks(t, tk, plain, req)
					}
				}
			})
		}
	}
}

// TestBlocksPrefixes checks what routing relies on: a later turn's block
// key extends an earlier turn's, and a different model or an edited message
// shares nothing past the edit.
func TestBlocksPrefixes(t *testing.T) {
	tk := newTok(t, Options{})
	msgs := conversation(12)
	var prev []uint32
	for n := 2; n <= len(msgs); n++ {
		req := &oai.Request{Kind: oai.KindChat, Model: "m", Messages: msgs[:n]}
		key, tokens := tk.Blocks(nil, req)
		if len(key) != tokens/DefaultKeyBlock {
			t.Fatalf("turn %d: %d values for %d tokens", n, len(key), tokens)
		}
		if !slices.Equal(key[:len(prev)], prev) {
			t.Fatalf("turn %d does not extend turn %d", n, n-1)
		}
		prev = key
	}
	other, _ := tk.Blocks(nil, &oai.Request{Kind: oai.KindChat, Model: "m2", Messages: msgs})
	if len(other) != len(prev) || other[0] == prev[0] {
		t.Fatalf("another model's key shares its first value")
	}
	edited := slices.Clone(msgs)
	edited[1] = msg("user", text("Something else entirely, at some length to fill blocks."))
	ed, _ := tk.Blocks(nil, &oai.Request{Kind: oai.KindChat, Model: "m", Messages: edited})
	first, _ := tk.Blocks(nil, &oai.Request{Kind: oai.KindChat, Model: "m", Messages: msgs[:1]})
	common := 0
	for common < min(len(ed), len(prev)) && ed[common] == prev[common] {
		common++
	}
	if common > len(first)+1 {
		t.Fatalf("edited second message: %d values shared, the first message has %d", common, len(first))
	}
}

// TestHashBlockSpreads checks the block hash on inputs that differ little:
// every single-token change of a block, and blocks of consecutive tokens,
// give distinct 64-bit states and (almost always) distinct values.
func TestHashBlockSpreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	states := make(map[uint64]bool)
	values := make(map[uint32]bool)
	add := func(b []uint32) {
		h := hashBlock(12345, b)
		if states[h] {
			t.Fatalf("state collision on %v", b)
		}
		states[h] = true
		values[blockValue(h)] = true
	}
	b := make([]uint32, DefaultKeyBlock)
	for i := range 4096 {
		for j := range b {
			b[j] = uint32(i*DefaultKeyBlock + j)
		}
		add(b)
	}
	for range 256 {
		for j := range b {
			b[j] = rng.Uint32N(200_000)
		}
		for pos := range b {
			orig := b[pos]
			for bit := range 18 {
				b[pos] = orig ^ 1<<bit
				add(b)
			}
			b[pos] = orig
		}
	}
	// 4096 + 256·16·18 = 77,824 states: a few value collisions of 32 bits
	// are expected by chance (about 0.7), hundreds would mean a weak mix.
	if lost := len(states) - len(values); lost > 8 {
		t.Fatalf("%d of %d values collide", lost, len(states))
	}
}

// Keys under different salts, or under none, share no value.
func TestSaltedNameSeparates(t *testing.T) {
	toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	names := []string{SaltedName("m", ""), SaltedName("m", "a"), SaltedName("m", "b"), SaltedName("m\x00cache_salt\x00a", "")}
	if names[0] != "m" {
		t.Fatalf("unsalted name %q, want the model", names[0])
	}
	seen := map[uint32]string{}
	for i, n := range names[:3] {
		for _, v := range AppendExactKey(nil, n, toks, 4) {
			if o, ok := seen[v]; ok {
				t.Fatalf("salt %d shares value %d with %q", i, v, o)
			}
			seen[v] = n
		}
	}
}
