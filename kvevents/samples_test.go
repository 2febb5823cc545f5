package kvevents

import (
	"encoding/hex"
	"reflect"
	"testing"
)

// engineSamples are event payloads byte for byte as the engines' msgspec
// encoders lay them out (ints in their shortest form, floats as float64,
// a struct's fields in their declared order, fields at their default left
// out), built from the event classes of each engine's public source:
//
//   - vLLM (late 2026): EventBatch and every event as maps, "type" first;
//     BlockStored's block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id, medium, lora_name (always sent), then
//     extra_keys (per block: the adapter's name, a tagged cache salt),
//     group_idx and kv_cache_spec_kind; data_parallel_rank last.
//   - SGLang (late 2026): the batch a positional [ts, events,
//     attn_dp_rank], each event a map tagged by "type", signed hashes,
//     one page per event, and a metadata map (cache_salt, session_id)
//     that its hashes leave out (-6148914691236517206 is read as
//     0xaaaaaaaaaaaaaaaa, the same 64 bits).
var engineSamples = []struct {
	name string
	hex  string
	want Batch
}{{
	name: "vLLM tagged, adapter and salt in extra_keys",
	hex: "83a27473cb41da556e40200000a66576656e7473938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cffedcba9876543210cf0123456789abcdef" +
		"b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc0020cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3" +
		"cd03f4cd03f5cd03f6cd03f7cd03f8cd03f9cd03facd03fbcd03fccd03fdcd03fecd03ffcd0400cd0401cd0402cd0403cd0404cd0405cd0406cd0407aa626c6f636b5f73" +
		"697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65a873716c2d6c6f7261aa65787472615f6b6579739292a873716c2d6c6f726192aa6361" +
		"6368655f73616c74a874656e616e742d6191a873716c2d6c6f7261a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74" +
		"696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf0123456789abcdefa66d656469756da3475055a967726f75705f696478008" +
		"1a474797065b0416c6c426c6f636b73436c6561726564b2646174615f706172616c6c656c5f72616e6b01",
	want: Batch{TS: 1767225600.5, DPRank: 1, Events: []Event{
		BlockStored{BlockHashes: []uint64{0xfedcba9876543210, 0x0123456789abcdef}, TokenIDs: sampleTokens(1000, 32), BlockSize: 16,
			Medium: "GPU", LoraName: "sql-lora", SpecKind: "full_attention",
			ExtraKeys: [][]byte{
				mustHex("92a873716c2d6c6f726192aa63616368655f73616c74a874656e616e742d61"), // ["sql-lora", ["cache_salt", "tenant-a"]]
				mustHex("91a873716c2d6c6f7261"),                                           // ["sql-lora"]
			}},
		BlockRemoved{BlockHashes: []uint64{0x0123456789abcdef}, Medium: "GPU"},
		AllBlocksCleared{},
	}},
}, {
	name: "SGLang tagged events in a positional batch, metadata salt",
	hex: "93cb41da556e405000009488a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391d3aaaaaaaaaaaaaaaab1706172656e745f626c6f636b5f6861" +
		"7368c0a9746f6b656e5f696473dc0010cd03e8cd03e9cd03eacd03ebcd03eccd03edcd03eecd03efcd03f0cd03f1cd03f2cd03f3cd03f4cd03f5cd03f6cd03f7aa626c6f" +
		"636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a86d6574616461746182aa63616368655f73616c74a874656e616e742d61aa73657373696f6e5f6964" +
		"a6736573732d3188a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573912ab1706172656e745f626c6f636b5f68617368d3aaaaaaaaaaaaaaaaa974" +
		"6f6b656e5f696473dc0010cd03f8cd03f9cd03facd03fbcd03fccd03fdcd03fecd03ffcd0400cd0401cd0402cd0403cd0404cd0405cd0406cd0407aa626c6f636b5f7369" +
		"7a6510a76c6f72615f6964c0a66d656469756da3475055a86d6574616461746182aa63616368655f73616c74a874656e616e742d61aa73657373696f6e5f6964a673657373" +
		"2d3183a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573912aa66d656469756da347505581a474797065b0416c6c426c6f636b73436c65617265" +
		"6400",
	want: Batch{TS: 1767225601.25, Events: []Event{
		BlockStored{BlockHashes: []uint64{0xaaaaaaaaaaaaaaaa}, TokenIDs: sampleTokens(1000, 16), BlockSize: 16, Medium: "GPU", CacheSalt: "tenant-a"},
		BlockStored{BlockHashes: []uint64{42}, ParentHash: 0xaaaaaaaaaaaaaaaa, HasParent: true, TokenIDs: sampleTokens(1016, 16), BlockSize: 16,
			Medium: "GPU", CacheSalt: "tenant-a"},
		BlockRemoved{BlockHashes: []uint64{42}, Medium: "GPU"},
		AllBlocksCleared{},
	}},
}}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// sampleTokens is n token ids from first on.
func sampleTokens(first uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = first + uint32(i) //nolint:gosec // small
	}
	return out
}

// TestDecodeEngineBytes: the engines' payloads, byte for byte, decode to
// what they say.
func TestDecodeEngineBytes(t *testing.T) {
	for _, s := range engineSamples {
		t.Run(s.name, func(t *testing.T) {
			got, err := Decode(mustHex(s.hex))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, s.want) {
				t.Fatalf("decoded\n %#v\nwant\n %#v", got, s.want)
			}
		})
	}
}
