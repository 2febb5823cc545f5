package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
)

// reuseKinds reads kvroute_reuse_tokens_total by kind.
func reuseKinds(t *testing.T, k *kvtest.KV) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, s := range scrape(t, k.Admin)["kvroute_reuse_tokens_total"] {
		out[s.labels["kind"]] += s.value
	}
	return out
}

// The miss split on a simulated fleet, each kind known by construction:
// a cold fleet misses by the workload; the same prompt again is
// delivered; after the holder drops its prefix cache the Index's
// prediction is lost (index_loss); while the holder is kept busy (a long
// stream; no load-bound floor, and λ so high that one request in flight
// outweighs any match)
// the prompt goes elsewhere and the holder's prefix is the routing's loss.
// Every request's kinds sum to the prompt tokens its engine reported.
func TestReuseSplit(t *testing.T) {
	const model = "sim-reuse"
	f, err := sim.StartFleet(context.Background(), 2, 0, sim.Config{
		Preset: "llama-8b-h100", Model: model, NumGPUBlocks: 4000, BlockSize: 16,
		StepBaseMs: 1, DecodeSeqMs: -1, DecodeCtxMs: -1, PrefillTokenMs: 0.0001, PrefillCtxMs: -1, PrefillAttnMs: -1,
		CachedTokenFrac: -1, WatermarkFrac: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	core, logs := observer.New(zapcore.InfoLevel)
	k := kvtest.StartLogged(t, zap.New(core), nil, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Backends = nil
		for i, u := range f.URLs {
			c.Backends = append(c.Backends, config.Backend{Name: fmt.Sprintf("sim-%d", i), URL: u, Engine: "vllm"})
		}
	})
	prompt := strings.Repeat("A long prompt that one user sends again and again to the fleet. ", 60)
	body := func(extra string) string {
		b, _ := json.Marshal(map[string]any{"model": model, "messages": []map[string]string{{"role": "user", "content": prompt}}, "max_tokens": 4})
		return strings.TrimSuffix(string(b), "}") + extra + "}"
	}
	// send posts the prompt and returns its replica and the split it added.
	send := func(step string) (string, map[string]float64) {
		t.Helper()
		before := reuseKinds(t, k)
		resp, out := postJSON(t, k.URL+"/v1/chat/completions", body(""))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d: %s", step, resp.StatusCode, out)
		}
		var usage struct {
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(out, &usage); err != nil || usage.Usage.PromptTokens == 0 {
			t.Fatalf("%s: no usage in %s", step, out)
		}
		var after map[string]float64
		kvtest.WaitFor(t, 5*time.Second, step+": the split counted", func() bool {
			after = reuseKinds(t, k)
			var sum float64
			for kind, v := range after {
				sum += v - before[kind]
			}
			return sum > 0
		})
		d := map[string]float64{}
		var sum float64
		for kind, v := range after {
			d[kind] = v - before[kind]
			sum += d[kind]
		}
		if int(sum) != usage.Usage.PromptTokens {
			t.Errorf("%s: split %v sums to %v, want the engine's %d prompt tokens", step, d, sum, usage.Usage.PromptTokens)
		}
		return resp.Header.Get("X-Kvroute-Backend"), d
	}
	holder, d := send("cold fleet")
	if d["workload_miss"] == 0 || d["delivered"]+d["routing_loss"]+d["index_loss"] != 0 {
		t.Errorf("cold fleet: %v, want all of it the workload's miss", d)
	}
	total := d["workload_miss"]
	// The access line gives the split as numbers.
	kvtest.WaitFor(t, 5*time.Second, "the access line", func() bool { return logs.FilterMessage("request").Len() == 1 })
	if f := logs.FilterMessage("request").All()[0].ContextMap(); f["workload_miss_tokens"] != int64(total) || f["delivered_tokens"] != int64(0) {
		t.Errorf("access line: workload_miss_tokens %v delivered_tokens %v, want %v and 0", f["workload_miss_tokens"], f["delivered_tokens"], total)
	}
	if rep, d := send("again"); rep != holder || d["delivered"] < total/2 || d["routing_loss"]+d["index_loss"] != 0 {
		t.Errorf("again: %s %v, want %s delivering most of %v", rep, d, holder, total)
	}
	reset, err := http.NewRequestWithContext(t.Context(), http.MethodPost, f.URLs[holderIndex(t, holder)]+"/reset_prefix_cache", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(reset)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if rep, d := send("evicted"); rep != holder || d["index_loss"] < total/2 || d["delivered"] != 0 {
		t.Errorf("evicted: %s %v, want %s with most of %v lost by the Index", rep, d, holder, total)
	}
	// A long stream keeps the holder busy.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, k.URL+"/v1/chat/completions",
			strings.NewReader(strings.Replace(body(`,"stream":true`), `"max_tokens":4`, `"max_tokens":30000`, 1)))
		req.Header.Set("Content-Type", "application/json")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body) // until the test ends
			_ = resp.Body.Close()
		}
	}()
	kvtest.WaitFor(t, 5*time.Second, "the holder busy", func() bool { return k.Srv.Fleet.ByName(holder).Load() == 1 })
	// With no load-bound floor and λ far above any match, one request in
	// flight is too many.
	cfg := *k.Srv.Config()
	if err := config.UpdatePolicy(&cfg, "cache_aware", func(p *router.CacheAwareConfig) { p.Lambda, p.BoundFloor = 1e9, 0 }); err != nil {
		t.Fatal(err)
	}
	if err := k.Srv.Reload(t.Context(), &cfg); err != nil {
		t.Fatal(err)
	}
	if rep, d := send("holder busy"); rep == holder || d["routing_loss"] < total/2 || d["delivered"] != 0 || d["index_loss"] != 0 {
		t.Errorf("holder busy: %s %v, want another replica and most of %v the routing's loss", rep, d, total)
	}
}

// holderIndex is the fleet index of the replica named sim-<i>.
func holderIndex(t *testing.T, name string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(name, "sim-%d", &i); err != nil {
		t.Fatalf("replica name %q", name)
	}
	return i
}
