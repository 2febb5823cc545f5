package runner

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// RunURL ignores the simulator's time scale: against a real endpoint the
// arrivals go out at the workload's own pace and the times are measured.
func TestRunURLIgnoresTimeScale(t *testing.T) {
	const delay = 200 * time.Millisecond
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		time.Sleep(delay)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" a\"}}]}\n\ndata: [DONE]\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close() }()
	url := "http://" + ln.Addr().String()

	o := DefaultOptions()
	o.TimeScale = 0.1 // the simulator's; RunURL must not apply it
	o.Workload = "hotprefix"
	o.HotPrefix = load.HotPrefixOptions{N: 3, Rate: 1000, Share: 0.5, PrefixTokens: 32, SuffixTokens: 8, MaxTokens: 1, Seed: 1}
	o.Out = filepath.Join(t.TempDir(), "out")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := RunURL(ctx, url, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TimeScale != 1 || rep.Target != url || len(rep.Results) != 1 {
		t.Fatalf("time scale %v, target %q, %d results", rep.TimeScale, rep.Target, len(rep.Results))
	}
	s := rep.Results[0].Summary
	if s.OK != 3 {
		t.Fatalf("%d/%d ok", s.OK, s.Requests)
	}
	if s.TTFT.P50 < delay.Seconds() || s.TTFT.P50 >= 10*delay.Seconds() {
		t.Errorf("TTFT p50 %.3fs: want the measured time, at least %v and not scaled up tenfold", s.TTFT.P50, delay)
	}
	for _, name := range []string{FileMarkdown, FileJSON, FileSVG} {
		if _, err := os.Stat(filepath.Join(o.Out, name)); err != nil {
			t.Errorf("no %s in Out: %v", name, err)
		}
	}
	md := rep.Markdown()
	for _, want := range []string{"against " + url, "in real time", "| target |", "| " + url + " | 3/3 | 0 | – |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	checkSVG(t, []byte(rep.SVG()), 1)

	if _, err := RunURL(ctx, "127.0.0.1:1", o); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Errorf("a URL without a scheme: got %v", err)
	}
}

// With a URLBound, RunURL tokenizes every request as it was sent (later
// turns with the answers received) through the fleet's renderer and bounds
// the endpoint's reported hits in those tokens: against one simulated
// replica with room for everything, the bound's prompt tokens are the
// engine's own count, the pooled and the finite bound are one cache, the
// replica, which also caches its answers, delivers at least the
// prompts-only bound, and kvroute in front splits every prompt token.
func TestRunURLBoundInEngineTokens(t *testing.T) {
	f, err := sim.StartFleet(context.Background(), 1, 0, sim.Config{
		Preset: "llama-8b-h100", Model: "sim-bound", NumGPUBlocks: 100000, BlockSize: 16,
		StepBaseMs: 1, DecodeSeqMs: -1, DecodeCtxMs: -1, PrefillTokenMs: 0.0001, PrefillCtxMs: -1, PrefillAttnMs: -1,
		CachedTokenFrac: -1, WatermarkFrac: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	o := DefaultOptions()
	o.Workload, o.Model = "multiturn", "sim-bound"
	o.MultiTurn = load.MultiTurnOptions{Users: 4, SystemPrompts: 2, SystemTokens: 300, Turns: 3, Think: 10 * time.Millisecond,
		UserTokens: 40, AnswerTokens: 20, Duration: 100 * time.Millisecond, Seed: 1}
	k := kvtest.Start(t, nil, func(cfg *config.Config) {
		cfg.Policy = "cache_aware"
		cfg.Backends = []config.Backend{{Name: "sim-0", URL: f.URLs[0], Engine: "vllm"}}
	})
	o.Bound = URLBound{RenderURL: f.URLs[0], BlockTokens: 16, Replicas: 1, CacheBlocks: 100000, AdminURL: k.Admin}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := RunURL(ctx, k.URL, o)
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Results[0]
	or := rep.Oracle
	if or == nil || !or.EngineTokens || or.Pooled == nil {
		t.Fatalf("oracle %+v", or)
	}
	if res.Summary.OK != 12 {
		t.Fatalf("%d of 12 ok", res.Summary.OK)
	}
	// The engine's prompt tokens, from its reported hits and hit rate.
	engine := int64(math.Round(float64(res.HitTokens) / res.Summary.ReportedHitRate))
	if or.Bound.PromptTokens != engine || or.Pooled.PromptTokens != engine || or.Ideal.PromptTokens != engine {
		t.Errorf("bounds over %d, %d and %d prompt tokens, the engine counted %d", or.Bound.PromptTokens, or.Pooled.PromptTokens, or.Ideal.PromptTokens, engine)
	}
	if or.Bound.HitTokens != or.Pooled.HitTokens || or.Bound.HitTokens != or.Ideal.HitTokens || or.Bound.HitTokens == 0 {
		t.Errorf("hits: bound %d, pooled %d, ideal %d; want one cache's, above 0", or.Bound.HitTokens, or.Pooled.HitTokens, or.Ideal.HitTokens)
	}
	if res.OfBound < 1 || res.OfPooled != res.OfBound {
		t.Errorf("of bound %.3f, of pooled %.3f: want at least 1 and equal", res.OfBound, res.OfPooled)
	}
	// kvroute's split of the run's prompt tokens: all of them, of which
	// the delivered are the engine's reported hits.
	var split int64
	for _, n := range res.Reuse {
		split += n
	}
	if split != engine || res.Reuse["delivered"] != res.HitTokens {
		t.Errorf("reuse split %v sums to %d, want %d with %d delivered", res.Reuse, split, engine, res.HitTokens)
	}
	if md := rep.Markdown(); !strings.Contains(md, "pooled bound (one LRU cache of all 1 replicas'") || !strings.Contains(md, "fraction of the pooled bound's") {
		t.Errorf("markdown lacks the pooled bound:\n%s", md)
	}
	o.Bound.CacheBlocks = 0
	if _, err := RunURL(ctx, f.URLs[0], o); err == nil || !strings.Contains(err.Error(), "--bound-cache-blocks") {
		t.Errorf("a bound without its cache size: %v", err)
	}
}
