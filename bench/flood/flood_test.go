package flood

import (
	"testing"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// A smaller flood than the command's default gigabyte, with small bounds so
// they are hit many times over: the tree and the caches must hold them.
func TestFloodHoldsBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("floods 48 MiB of prompts")
	}
	rep, err := Run(Options{Bytes: 48 << 20, PromptBytes: 32 << 10, TreeMaxBytes: 512 << 10, CacheBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.WithinBounds {
		t.Fatalf("bounds broken: tree %d / %d bytes, caches %d / %d bytes", rep.TreeBytesMax, rep.TreeBound, rep.CacheBytesMax, rep.CacheBound)
	}
	if rep.TreeBytesMax < rep.TreeBound/2 || rep.CacheBytesMax < rep.CacheBound/2 {
		t.Errorf("flood too small to test the bounds: tree %d, caches %d", rep.TreeBytesMax, rep.CacheBytesMax)
	}
	t.Logf("%d requests, %.1f MB/s, peak RSS %d MiB, heap in use max %d MiB", rep.Requests,
		float64(rep.PromptBytes)/rep.Seconds/1e6, rep.PeakRSS>>20, rep.HeapInuseMax>>20)
}

func TestTraceReplayHoldsBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("replays part of the trace")
	}
	// The trace is not part of the repository: MOONCAKE_TRACE names the
	// downloaded file (load.MooncakeTraceURL), or it sits beside the checkout.
	trace := kvtest.Trace("MOONCAKE_TRACE", "mooncake-fast25/conversation_trace.jsonl")
	if trace == "" {
		t.Skip("trace not given (set MOONCAKE_TRACE to the downloaded file)")
	}
	rep, err := RunTrace(trace, Options{TreeMaxBytes: 8 << 20, CacheBytes: 8 << 20, Bytes: 0})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.WithinBounds || rep.Requests < 12000 {
		t.Fatalf("%d requests; tree %d / %d, caches %d / %d", rep.Requests, rep.TreeBytesMax, rep.TreeBound, rep.CacheBytesMax, rep.CacheBound)
	}
	t.Logf("%d requests, %.1f MB/s, tree %.2f B/token, peak RSS %d MiB", rep.Requests, float64(rep.PromptBytes)/rep.Seconds/1e6, rep.BytesPerToken, rep.PeakRSS>>20)
}
