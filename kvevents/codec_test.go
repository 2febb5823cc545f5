package kvevents

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// pack encodes v as the engines' msgpack libraries would lay it out: Go
// slices as arrays, maps as maps, []byte as bin.
func pack(t testing.TB, v any) []byte {
	t.Helper()
	p, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// om is a map whose keys are written in the order given, as msgspec writes
// a struct's fields (a Go map would be written in random order).
type om []any

func (m om) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m) / 2); err != nil {
		return err
	}
	for _, v := range m {
		if err := e.Encode(v); err != nil {
			return err
		}
	}
	return nil
}

func digest(s string) []byte {
	d := sha256.Sum256([]byte(s))
	return d[:]
}

func tail8(d []byte) uint64 { return binary.BigEndian.Uint64(d[len(d)-8:]) }

func TestDecodeEngineFormats(t *testing.T) {
	cacheSalt := pack(t, []any{"salt-1"})
	cases := []struct {
		name    string
		payload any
		want    Batch
	}{{
		name: "vLLM tagged, all fields",
		payload: om{"ts", 1767225600.25, "events", []any{
			om{"type", "BlockStored", "block_hashes", []any{uint64(math.MaxUint64), 7},
				"parent_block_hash", 3, "token_ids", []any{1, 2, 3, 4}, "block_size", 2,
				"lora_id", nil, "medium", "GPU", "lora_name", "sql-lora",
				"extra_keys", []any{[]any{"salt-1"}, nil}, "group_idx", 1,
				"kv_cache_spec_kind", "full_attention", "kv_cache_spec_sliding_window", nil},
			om{"type", "BlockRemoved", "block_hashes", []any{7}, "medium", "GPU", "group_idx", 1},
			om{"type", "AllBlocksCleared"},
		}, "data_parallel_rank", 2},
		want: Batch{TS: 1767225600.25, DPRank: 2, Events: []Event{
			BlockStored{BlockHashes: []uint64{math.MaxUint64, 7}, ParentHash: 3, HasParent: true,
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, Medium: "GPU", LoraName: "sql-lora",
				ExtraKeys: [][]byte{cacheSalt, nil}, GroupIdx: 1, SpecKind: "full_attention"},
			BlockRemoved{BlockHashes: []uint64{7}, Medium: "GPU", GroupIdx: 1},
			AllBlocksCleared{},
		}},
	}, {
		name: "vLLM tagged, type key last, defaults omitted, no rank",
		payload: om{"events", []any{
			om{"block_hashes", []any{5}, "parent_block_hash", nil, "token_ids", []any{9, 9},
				"block_size", 2, "lora_id", nil, "medium", nil, "lora_name", nil, "type", "BlockStored"},
		}, "ts", 10},
		want: Batch{TS: 10, Events: []Event{
			BlockStored{BlockHashes: []uint64{5}, TokenIDs: []uint32{9, 9}, BlockSize: 2},
		}},
	}, {
		name: "vLLM positional, hashes as sha256 digests",
		payload: []any{1.5, []any{
			[]any{"BlockStored", []any{digest("a"), digest("b")}, digest("p"), []any{1, 2, 3, 4}, 2, 3, "CPU"},
			[]any{"BlockRemoved", []any{digest("a")}},
			[]any{"AllBlocksCleared"},
		}},
		want: Batch{TS: 1.5, Events: []Event{
			BlockStored{BlockHashes: []uint64{tail8(digest("a")), tail8(digest("b"))},
				ParentHash: tail8(digest("p")), HasParent: true,
				TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 2, LoraID: 3, Medium: "CPU"},
			BlockRemoved{BlockHashes: []uint64{tail8(digest("a"))}},
			AllBlocksCleared{},
		}},
	}, {
		name: "vLLM positional, every field and two more",
		payload: []any{2.0, []any{
			[]any{"BlockStored", []any{1}, nil, []any{5, 6}, 2, nil, "GPU", "lora-a",
				[]any{nil}, 3, "mla_attention", nil, "future"},
			[]any{"BlockRemoved", []any{1}, "GPU", 3, "future"},
		}, 1, "future"},
		want: Batch{TS: 2, DPRank: 1, Events: []Event{
			BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{5, 6}, BlockSize: 2,
				Medium: "GPU", LoraName: "lora-a", ExtraKeys: [][]byte{nil}, GroupIdx: 3,
				SpecKind: "mla_attention"},
			BlockRemoved{BlockHashes: []uint64{1}, Medium: "GPU", GroupIdx: 3},
		}},
	}, {
		name: "SGLang: signed hashes, one page per event, metadata struct, attn_dp_rank",
		payload: []any{3.0, []any{
			[]any{"BlockStored", []any{int64(-2)}, int64(-1), []any{10, 11, 12, 13}, 4, nil, "GPU"},
			[]any{"BlockStored", []any{int64(99)}, int64(-2), []any{14, 15, 16, 17}, 4, nil, "GPU", []any{"salt"}},
			[]any{"BlockRemoved", []any{int64(-2)}, "CPU_PINNED"},
		}, 5},
		want: Batch{TS: 3, DPRank: 5, Events: []Event{
			BlockStored{BlockHashes: []uint64{math.MaxUint64 - 1}, ParentHash: math.MaxUint64, HasParent: true,
				TokenIDs: []uint32{10, 11, 12, 13}, BlockSize: 4, Medium: "GPU"},
			BlockStored{BlockHashes: []uint64{99}, ParentHash: math.MaxUint64 - 1, HasParent: true,
				TokenIDs: []uint32{14, 15, 16, 17}, BlockSize: 4, Medium: "GPU"},
			BlockRemoved{BlockHashes: []uint64{math.MaxUint64 - 1}, Medium: "CPU_PINNED"},
		}},
	}, {
		// msgspec with tag=True and no array_like: each event a map, its
		// "type" first; the batch stays positional, its rank last.
		name: "SGLang tagged: events as maps, a metadata map with cache_salt and session_id",
		payload: []any{8.0, []any{
			om{"type", "BlockStored", "block_hashes", []any{int64(-5)}, "parent_block_hash", nil,
				"token_ids", []any{1, 2, 3, 4}, "block_size", 4, "lora_id", 3, "medium", "GPU",
				"metadata", om{"cache_salt", "tenant-a", "session_id", "sess-9"}},
			om{"type", "BlockStored", "block_hashes", []any{int64(6)}, "parent_block_hash", int64(-5),
				"token_ids", []any{5, 6, 7, 8}, "block_size", 4, "lora_id", nil, "medium", "GPU",
				"metadata", om{"cache_salt", nil, "session_id", "sess-9"}},
			om{"type", "BlockRemoved", "block_hashes", []any{int64(-5)}, "medium", "GPU"},
			om{"type", "AllBlocksCleared"},
		}, 2},
		want: Batch{TS: 8, DPRank: 2, Events: []Event{
			BlockStored{BlockHashes: []uint64{math.MaxUint64 - 4}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4,
				LoraID: 3, Medium: "GPU", CacheSalt: "tenant-a"},
			BlockStored{BlockHashes: []uint64{6}, ParentHash: math.MaxUint64 - 4, HasParent: true,
				TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 4, Medium: "GPU"},
			BlockRemoved{BlockHashes: []uint64{math.MaxUint64 - 4}, Medium: "GPU"},
			AllBlocksCleared{},
		}},
	}, {
		name:    "SGLang batch map key",
		payload: om{"ts", 4.0, "events", []any{}, "attn_dp_rank", 3},
		want:    Batch{TS: 4, DPRank: 3},
	}, {
		name: "unknown event types are skipped and counted, in both encodings",
		payload: om{"ts", 5.0, "events", []any{
			[]any{"BlockTransferred", []any{1}, "CPU"},
			om{"type", "BlockPinned", "block_hashes", "not a list"},
			[]any{"AllBlocksCleared"},
		}},
		want: Batch{TS: 5, Skipped: 2, Events: []Event{AllBlocksCleared{}}},
	}, {
		// An independent vLLM stand-in writes 0 for a first block's parent
		// where vLLM writes null: both start a sequence.
		name: "a parent hash of 0 is no parent",
		payload: om{"ts", 7.0, "events", []any{
			om{"type", "BlockStored", "block_hashes", []any{5}, "parent_block_hash", 0, "token_ids", []any{9, 9}, "block_size", 2},
		}},
		want: Batch{TS: 7, Events: []Event{BlockStored{BlockHashes: []uint64{5}, TokenIDs: []uint32{9, 9}, BlockSize: 2}}},
	}, {
		name:    "a short hash is its bytes, big-endian",
		payload: []any{6.0, []any{[]any{"BlockRemoved", []any{[]byte{1, 2}}}}},
		want:    Batch{TS: 6, Events: []Event{BlockRemoved{BlockHashes: []uint64{0x0102}}}},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := Decode(pack(t, c.payload))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("decoded\n %#v\nwant\n %#v", got, c.want)
			}
		})
	}
}

func TestDecodeRejectsMalformed(t *testing.T) {
	deep := bytes.Repeat([]byte{0x91}, 100) // arrays nested 100 deep
	cases := []struct {
		name    string
		payload []byte
		err     string
	}{
		{"empty", nil, "array or a map"},
		{"a string", pack(t, "hello"), "array or a map"},
		{"truncated", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, 2, 3}}}})[:9], "ends inside"},
		{"bytes after the batch", append(pack(t, []any{1.0, []any{}}), 0xc0), "after the batch"},
		{"batch without events", pack(t, []any{1.0}), "needs ts and events"},
		{"map batch without ts", pack(t, om{"events", []any{}}), "needs ts and events"},
		{"ts a string", pack(t, []any{"now", []any{}}), "ts"},
		{"event a number", pack(t, []any{1.0, []any{7}}), "array or a map"},
		{"event without type", pack(t, []any{1.0, []any{om{"block_hashes", []any{1}}}}), "needs a type"},
		{"event type not a string", pack(t, []any{1.0, []any{[]any{1, 2}}}), "event type"},
		{"empty event array", pack(t, []any{1.0, []any{[]any{}}}), "needs its type"},
		{"short BlockStored", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}}}}), "needs block_hashes"},
		{"BlockStored map without tokens", pack(t, []any{1.0, []any{om{"type", "BlockStored", "block_hashes", []any{1}, "block_size", 1}}}), "needs block_hashes"},
		{"BlockRemoved map without hashes", pack(t, []any{1.0, []any{om{"type", "BlockRemoved"}}}), "needs block_hashes"},
		{"block size a string", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}, "16"}}}), "block_size"},
		{"negative block size", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{1}, -1}}}), "block_size out of range"},
		{"negative token", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}), "token id out of range"},
		{"token above uint32", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 32}, 1}}}), "token id out of range"},
		{"nil among hashes", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1, nil}}}}), "block hash"},
		{"medium a number", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1}, 5}}}), "medium"},
		{"array longer than the payload", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, "ends inside"},
		{"string longer than the payload", []byte{0x92, 0x01, 0x91, 0x91, 0xdb, 0x7f, 0xff, 0xff, 0xff}, "ends inside"},
		{"nested too deeply", append([]byte{0x92, 0x01, 0x91, 0x93, 0xa1, 'X'}, deep...), "nested too deeply"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := Decode(c.payload)
			if err == nil {
				t.Fatalf("decoded %#v, want an error", b)
			}
			if !strings.Contains(err.Error(), c.err) {
				t.Fatalf("error %q, want it to mention %q", err, c.err)
			}
		})
	}
	// 0xc1 is never used by msgpack.
	if _, err := Decode([]byte{0x92, 0x01, 0x91, 0x92, 0xa1, 'X', 0xc1}); err == nil || !strings.Contains(err.Error(), "invalid msgpack code") {
		t.Fatalf("code 0xc1: error %v", err)
	}
}

func TestEncodeIsWhatVLLMSends(t *testing.T) {
	b := Batch{TS: 1.25, DPRank: 1, Events: []Event{
		BlockStored{BlockHashes: []uint64{10}, TokenIDs: []uint32{1, 2}, BlockSize: 2, Medium: "GPU"},
		BlockRemoved{BlockHashes: []uint64{10}, Medium: "GPU"},
		AllBlocksCleared{},
	}}
	cases := []struct {
		enc  Encoding
		want any
	}{{
		Tagged,
		om{"ts", 1.25, "events", []any{
			om{"type", "BlockStored", "block_hashes", []any{10}, "parent_block_hash", nil,
				"token_ids", []any{1, 2}, "block_size", 2, "lora_id", nil, "medium", "GPU",
				"lora_name", nil, "group_idx", 0},
			om{"type", "BlockRemoved", "block_hashes", []any{10}, "medium", "GPU", "group_idx", 0},
			om{"type", "AllBlocksCleared"},
		}, "data_parallel_rank", 1},
	}, {
		Positional,
		[]any{1.25, []any{
			[]any{"BlockStored", []any{10}, nil, []any{1, 2}, 2, nil, "GPU", nil, nil, 0},
			[]any{"BlockRemoved", []any{10}, "GPU", 0},
			[]any{"AllBlocksCleared"},
		}, 1},
	}}
	for _, c := range cases {
		t.Run(c.enc.String(), func(t *testing.T) {
			got, err := Encode(b, c.enc)
			if err != nil {
				t.Fatal(err)
			}
			// Compare structure, not integer widths: decode both generically.
			var g, w any
			if err := msgpack.Unmarshal(got, &g); err != nil {
				t.Fatal(err)
			}
			if err := msgpack.Unmarshal(pack(t, c.want), &w); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(normalize(g), normalize(w)) {
				t.Fatalf("encoded\n %v\nwant\n %v", g, w)
			}
			if c.enc == Tagged && !bytes.HasPrefix(got[1:], pack(t, "ts")) {
				t.Fatalf("tagged batch does not start with ts: %x", got)
			}
		})
	}
	if _, err := Encode(b, Encoding(7)); err == nil {
		t.Fatal("Encode accepted an unknown encoding")
	}
	bad := Batch{Events: []Event{BlockStored{ExtraKeys: [][]byte{{0x92, 0x01}}}}}
	if _, err := Encode(bad, Tagged); err == nil {
		t.Fatal("Encode accepted an extra key that is not one msgpack value")
	}
}

// normalize makes generically decoded msgpack comparable: every integer as
// int64 (msgpack libraries pick different widths).
func normalize(v any) any {
	switch v := v.(type) {
	case []any:
		out := make([]any, len(v))
		for i := range v {
			out[i] = normalize(v[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, x := range v {
			out[k] = normalize(x)
		}
		return out
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return reflect.ValueOf(v).Convert(reflect.TypeFor[int64]()).Interface()
	}
	return v
}

// randBatch draws a batch covering every field: full-range hashes, optional
// fields set and unset, extra keys with nil entries, and all event kinds.
func randBatch(rng *rand.Rand) Batch {
	b := Batch{TS: float64(rng.Uint64N(1<<40)) / 1024, DPRank: rng.IntN(8)}
	n := rng.IntN(6)
	for range n {
		switch rng.IntN(3) {
		case 0:
			b.Events = append(b.Events, randStored(rng))
		case 1:
			b.Events = append(b.Events, BlockRemoved{BlockHashes: randHashes(rng, 1+rng.IntN(4)),
				Medium: pick(rng, "", "GPU", "CPU"), GroupIdx: rng.IntN(3)})
		default:
			b.Events = append(b.Events, AllBlocksCleared{})
		}
	}
	return b
}

func randStored(rng *rand.Rand) BlockStored {
	blocks, size := 1+rng.IntN(4), 1+rng.IntN(4)
	ev := BlockStored{BlockHashes: randHashes(rng, blocks), BlockSize: size,
		Medium: pick(rng, "", "GPU", "CPU"), LoraName: pick(rng, "", "adapter"),
		GroupIdx: rng.IntN(3), SpecKind: pick(rng, "", "full_attention", "sliding_window", "mamba")}
	if rng.IntN(2) == 0 {
		ev.ParentHash, ev.HasParent = rng.Uint64(), true
	}
	if rng.IntN(3) == 0 {
		ev.LoraID = rng.Int64() - math.MaxInt64/2
	}
	ev.TokenIDs = make([]uint32, blocks*size)
	for i := range ev.TokenIDs {
		ev.TokenIDs[i] = rng.Uint32()
	}
	if rng.IntN(2) == 0 {
		ev.ExtraKeys = make([][]byte, blocks)
		for i := range ev.ExtraKeys {
			if rng.IntN(2) == 0 {
				p, _ := msgpack.Marshal([]any{"mm-" + pick(rng, "a", "b"), rng.IntN(1000)})
				ev.ExtraKeys[i] = p
			}
		}
	}
	return ev
}

func randHashes(rng *rand.Rand, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = rng.Uint64()
	}
	return hs
}

func pick(rng *rand.Rand, s ...string) string { return s[rng.IntN(len(s))] }

func TestDecodeEncodeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 1))
	for i := range 2000 {
		b := randBatch(rng)
		for _, enc := range []Encoding{Tagged, Positional} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("batch %d, %v: %v", i, enc, err)
			}
			if !reflect.DeepEqual(got, b) {
				t.Fatalf("batch %d, %v: decoded\n %#v\nwant\n %#v", i, enc, got, b)
			}
		}
	}
}

func TestAttentionAndSpans(t *testing.T) {
	for kind, want := range map[string]bool{
		"": true, "full_attention": true, "mla_attention": true, "sink_full": true,
		"sliding_window": false, "mamba": false, "chunked_local_attention": false, "cross_attention": false,
	} {
		if Attention(kind) != want {
			t.Errorf("Attention(%q) = %v, want %v", kind, !want, want)
		}
	}
	whole := BlockStored{BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16}
	if !Spans(whole) || !Indexable(whole) {
		t.Error("two whole blocks of 16 rejected")
	}
	short := whole
	short.TokenIDs = short.TokenIDs[:31]
	if Spans(short) || Indexable(short) {
		t.Error("31 tokens for two blocks of 16 accepted")
	}
	if Spans(BlockStored{BlockHashes: []uint64{1}}) {
		t.Error("a block size of 0 accepted")
	}
	mamba := whole
	mamba.SpecKind = "mamba"
	if !Spans(mamba) || Indexable(mamba) {
		t.Error("a mamba group indexed")
	}
}
