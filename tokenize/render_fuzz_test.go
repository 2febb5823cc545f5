package tokenize

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// FuzzRenderKey renders arbitrary request bodies that parse: rendering
// must not panic, must be deterministic, and caching must not change keys
// or block keys (which must be those of the key's blocks).
func FuzzRenderKey(f *testing.F) {
	f.Add(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function"}]}`)
	f.Add(`{"prompt":["a b","c"]}`)
	f.Add(`{"prompt":[[1,2,3],[4]]}`)
	f.Add(`{"input":[{"role":"user","content":"é\u0301 日本 🙂"},{"type":"x"}],"instructions":"s"}`)
	cached, err := New(Options{CacheBytes: 1 << 20, ChunkBytes: 64, KeyBlock: 4})
	if err != nil {
		f.Fatal(err)
	}
	plain, err := New(Options{CacheBytes: -1, ChunkBytes: 64})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if len(body) > 4096 {
			return // keeps each run and its minimization short; long texts are covered by the corpus tests
		}
		for k := oai.KindChat; k <= oai.KindGenerate; k++ {
			req, err := oai.Parse(k, []byte(body))
			if err != nil {
				continue
			}
			a := cached.Key(nil, req)
			b := cached.Key(nil, req)
			c := plain.Key(nil, req)
			if !slices.Equal(a, b) || !slices.Equal(a, c) {
				t.Fatalf("keys differ: cached %d, again %d, uncached %d tokens", len(a), len(b), len(c))
			}
			// Twice: the second may find the first in the conversation cache.
			for range 2 {
				blocks, tokens := cached.Blocks(nil, req)
				if want := refBlocks(req.Model, c, 4); !slices.Equal(blocks, want) || tokens != len(c) {
					t.Fatalf("block key of %d values for %d tokens, want %d values for %d", len(blocks), tokens, len(want), len(c))
				}
			}
		}
	})
}
