package tokenize

import (
	"sync"
	"testing"

	tiktoken "github.com/pkoukk/tiktoken-go"
	loader "github.com/pkoukk/tiktoken-go-loader"
)

// The reference encoder is tiktoken-go with its offline loader. The loader
// is set before any encoding is fetched, so tiktoken-go never downloads.
var (
	refOnce sync.Once
	refMu   sync.Mutex
	refEnc  = map[string]*tiktoken.Tiktoken{}
)

func reference(tb testing.TB, name string) *tiktoken.Tiktoken {
	tb.Helper()
	refOnce.Do(func() { tiktoken.SetBpeLoader(loader.NewOfflineLoader()) })
	refMu.Lock()
	defer refMu.Unlock()
	if e := refEnc[name]; e != nil {
		return e
	}
	e, err := tiktoken.GetEncoding(name)
	if err != nil {
		tb.Fatalf("tiktoken.GetEncoding(%q): %v", name, err)
	}
	refEnc[name] = e
	return e
}

// referenceTokens encodes text with tiktoken-go.
func referenceTokens(tb testing.TB, name, text string) []uint32 {
	ids := reference(tb, name).EncodeOrdinary(text)
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	return out
}

func testVocab(tb testing.TB, name string) *vocab {
	tb.Helper()
	initClasses()
	v, err := loadVocab(name)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}
