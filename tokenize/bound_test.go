package tokenize

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// manyMessages is a chat body of n short messages, the shape of the
// many-messages attack (bench/attack).
func manyMessages(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","messages":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"role":"user","content":"hi %d"}`, i)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// repeated is a body of kind k: head, n copies of item separated by
// commas, tail.
func repeated(head, item, tail string, n int) []byte {
	return []byte(head + strings.TrimSuffix(strings.Repeat(item+",", n), ",") + tail)
}

// boundShapes are bodies of about 1 to 4 MB whose routing fields cost the
// most per byte of body: many short messages, and thousands of near-empty
// parts, items, prompt strings or token lists.
var boundShapes = []struct {
	name string
	kind oai.Kind
	body func() []byte
}{
	{"short messages", oai.KindChat, func() []byte { return manyMessages(100_000) }},
	{"empty messages", oai.KindChat, func() []byte { return repeated(`{"messages":[`, `{"role":""}`, `]}`, 200_000) }},
	{"named messages", oai.KindChat, func() []byte { return repeated(`{"messages":[`, `{"role":"","name":"a"}`, `]}`, 100_000) }},
	{"empty parts", oai.KindChat, func() []byte { return repeated(`{"messages":[{"role":"u","content":[`, `{}`, `]}]}`, 1_000_000) }},
	{"string parts", oai.KindChat, func() []byte { return repeated(`{"messages":[{"role":"u","content":[`, `""`, `]}]}`, 1_000_000) }},
	{"empty items", oai.KindResponses, func() []byte { return repeated(`{"input":[`, `{}`, `]}`, 1_000_000) }},
	{"prompt strings", oai.KindCompletion, func() []byte { return repeated(`{"prompt":[`, `""`, `]}`, 1_000_000) }},
	{"token lists", oai.KindCompletion, func() []byte { return repeated(`{"prompt":[`, `[1]`, `]}`, 500_000) }},
	{"token ids", oai.KindCompletion, func() []byte { return repeated(`{"prompt":[`, `1`, `]}`, 1_000_000) }},
	{"dense text", oai.KindChat, func() []byte {
		return []byte(`{"messages":[{"role":"u","content":"` + strings.Repeat("ꙮ𝔘ẞ ", 100_000) + `"}]}`)
	}},
}

// routingCost returns the bytes allocated by parsing body and computing
// its block key, as the proxy does for a request no pooled buffer fits.
func routingCost(t testing.TB, tk *Tokenizer, k oai.Kind, body []byte) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	req, err := oai.Parse(k, body)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := tk.AppendBlocks(nil, req)
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(key)
	return after.TotalAlloc - before.TotalAlloc
}

// maxCostPerByte is the most a request's routing fields (the parsed
// messages, parts and prompt, the tokens and the block key) may allocate
// per byte of its body, beyond maxCostSlack: docs/memory.md's request
// parsing term.
const (
	maxCostPerByte = 5
	maxCostSlack   = 256 << 10
)

// TestRoutingCostBoundedByBody: whatever the shape of a body, computing its
// routing key allocates at most maxCostPerByte times its size (the token
// cache, bounded on its own, disabled). 100,000 short messages allocated
// 64 MB for their 3.7 MB body before messages and parts were sized from a
// count and tokens hashed as they came.
func TestRoutingCostBoundedByBody(t *testing.T) {
	tk, err := New(Options{CacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range boundShapes {
		body := s.body()
		cost := routingCost(t, tk, s.kind, body)
		t.Logf("%s: body %d B, routing fields %d B: %.2f per byte", s.name, len(body), cost, float64(cost)/float64(len(body)))
		if limit := uint64(maxCostPerByte*len(body) + maxCostSlack); cost > limit {
			t.Errorf("%s: %d B for a body of %d B, over %d", s.name, cost, len(body), limit)
		}
	}
}

// BenchmarkManyMessages parses a body of 100,000 short messages and
// computes its block key, with the token cache on.
func BenchmarkManyMessages(b *testing.B) {
	tk, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	body := manyMessages(100_000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var key []uint32
	for b.Loop() {
		req, err := oai.Parse(oai.KindChat, body)
		if err != nil {
			b.Fatal(err)
		}
		key, _ = tk.Blocks(key, req)
	}
}
