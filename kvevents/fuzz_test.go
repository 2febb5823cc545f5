package kvevents

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
)

// FuzzDecode feeds Decode arbitrary payloads: it must never panic, and what
// it accepts must survive Encode and Decode again unchanged, in both
// encodings.
func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(20, 2))
	for range 8 {
		b := randBatch(rng)
		for _, enc := range []Encoding{Tagged, Positional} {
			p, err := Encode(b, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	// SGLang: positional, signed hashes, one page per event, a metadata
	// struct where vLLM has lora_name.
	f.Add(pack(f, []any{3.0, []any{
		[]any{"BlockStored", []any{int64(-2)}, int64(-1), []any{10, 11, 12, 13}, 4, nil, "GPU", []any{"salt"}},
		[]any{"BlockRemoved", []any{int64(-2)}, "CPU_PINNED"},
	}, 5}))
	// Older vLLM: digests as hashes, no rank.
	f.Add(pack(f, []any{1.5, []any{
		[]any{"BlockStored", []any{digest("a")}, nil, []any{1, 2}, 2, nil, "GPU"},
		[]any{"AllBlocksCleared"},
	}}))
	// Tagged with an unknown event and unknown keys.
	f.Add(pack(f, om{"ts", 5.0, "events", []any{
		om{"type", "BlockTransferred", "block_hashes", []any{1}},
		om{"type", "BlockRemoved", "block_hashes", []any{1}, "new_field", []any{1, 2}},
	}, "data_parallel_rank", 0}))
	f.Add([]byte{})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("not msgpack at all"))
	f.Add([]byte{0x92, 0x01, 0x91, 0x93, 0xa1, 'X', 0x91, 0x91, 0x91, 0xc7, 0xff})

	// SGLang's metadata, positional and tagged.
	f.Add(pack(f, []any{2.0, []any{
		[]any{"BlockStored", []any{7}, nil, []any{1, 2}, 2, nil, "GPU", om{"cache_salt", "s", "session_id", "x"}},
	}}))
	f.Add(pack(f, om{"ts", 5.0, "events", []any{
		om{"type", "BlockStored", "block_hashes", []any{1}, "token_ids", []any{1}, "block_size", 1,
			"lora_name", "ad", "metadata", om{"cache_salt", "s"}},
	}}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		b.Skipped = 0
		for _, enc := range []Encoding{Tagged, Positional} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("%v: cannot encode what Decode accepted: %v", enc, err)
			}
			again, err := Decode(p)
			if err != nil {
				t.Fatalf("%v: cannot decode what Encode wrote: %v", enc, err)
			}
			want := b
			if enc == Positional {
				want = positionalSalts(b)
			}
			if math.IsNaN(want.TS) && math.IsNaN(again.TS) {
				want.TS, again.TS = 0, 0 // NaN != NaN
			}
			if !reflect.DeepEqual(again, want) {
				t.Fatalf("%v: round trip changed the batch\n %#v\nto\n %#v", enc, b, again)
			}
		}
	})
}

// positionalSalts is b as the positional encoding gives it back: without
// the cache salt of events that have a LoRA name (both take one place).
func positionalSalts(b Batch) Batch {
	evs := slices.Clone(b.Events)
	for i, ev := range evs {
		if st, ok := ev.(BlockStored); ok && st.LoraName != "" {
			st.CacheSalt = ""
			evs[i] = st
		}
	}
	b.Events = evs
	return b
}
