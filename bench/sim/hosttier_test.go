package sim

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// lruOrder lists a host tier's keys from least to most recently used,
// checking the links both ways.
func lruOrder(t *testing.T, h *hostTier) []uint64 {
	t.Helper()
	var out []uint64
	prev := -1
	for i := h.head; i >= 0; i = h.ents[i].next {
		if h.ents[i].prev != prev {
			t.Fatalf("entry %d: prev %d, want %d", i, h.ents[i].prev, prev)
		}
		out = append(out, h.ents[i].key)
		prev = i
		if len(out) > len(h.ents) {
			t.Fatal("cycle in the LRU list")
		}
	}
	if h.tail != prev {
		t.Fatalf("tail %d, want %d", h.tail, prev)
	}
	if len(out) != h.len() {
		t.Fatalf("list holds %d keys, index %d", len(out), h.len())
	}
	return out
}

func TestHostTierLRU(t *testing.T) {
	type op struct {
		kind byte // 's' store, 't' touch, 'r' run (no refresh), 'c' contains (no refresh)
		keys []uint64
	}
	s := func(keys ...uint64) op { return op{'s', keys} }
	touch := func(keys ...uint64) op { return op{'t', keys} }
	look := func(keys ...uint64) op { return op{'r', keys} }
	has := func(keys ...uint64) op { return op{'c', keys} }
	tests := []struct {
		name string
		cap  int
		ops  []op
		want []uint64 // LRU order after ops, least recent first
		gone []uint64 // keys that must not be held
	}{
		{"under capacity keeps insertion order", 4, []op{s(1, 2, 3)}, []uint64{1, 2, 3}, nil},
		{"full evicts least recent", 3, []op{s(1, 2, 3, 4, 5)}, []uint64{3, 4, 5}, []uint64{1, 2}},
		{"capacity one", 1, []op{s(1, 2)}, []uint64{2}, []uint64{1}},
		{"store of a held key refreshes", 3, []op{s(1, 2, 3, 1, 4)}, []uint64{3, 1, 4}, []uint64{2}},
		{"store of a held key does not grow", 3, []op{s(1, 2, 2, 2)}, []uint64{1, 2}, nil},
		{"touch refreshes", 3, []op{s(1, 2, 3), touch(1), s(4)}, []uint64{3, 1, 4}, []uint64{2}},
		{"touch of the tail is a no-op", 3, []op{s(1, 2, 3), touch(3)}, []uint64{1, 2, 3}, nil},
		{"touch of a missing key adds nothing", 2, []op{s(1), touch(9)}, []uint64{1}, []uint64{9}},
		{"run and contains do not refresh", 3, []op{s(1, 2, 3), look(1, 2), has(1), s(4)}, []uint64{2, 3, 4}, []uint64{1}},
		{"slots are reused", 2, []op{s(1, 2, 3, 4, 5, 6, 7, 8)}, []uint64{7, 8}, []uint64{1, 6}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHostTier(tc.cap)
			for _, o := range tc.ops {
				for _, k := range o.keys {
					switch o.kind {
					case 's':
						h.store(k)
					case 't':
						h.touch(k)
					case 'r':
						h.run([]uint64{k})
					case 'c':
						h.contains(k)
					}
				}
			}
			if got := lruOrder(t, h); !slices.Equal(got, tc.want) {
				t.Fatalf("LRU order %v, want %v", got, tc.want)
			}
			for _, k := range tc.gone {
				if h.contains(k) {
					t.Errorf("key %d still held", k)
				}
			}
			if len(h.ents) > tc.cap {
				t.Errorf("arena grew to %d entries, capacity %d", len(h.ents), tc.cap)
			}
		})
	}
}

func TestHostTierRun(t *testing.T) {
	h := newHostTier(10)
	for _, k := range []uint64{1, 2, 4} {
		h.store(k)
	}
	for _, tc := range []struct {
		keys []uint64
		want int
	}{
		{nil, 0},
		{[]uint64{1, 2, 3, 4}, 2}, // the run breaks at 3; 4 does not count
		{[]uint64{1, 2, 4}, 3},
		{[]uint64{3, 1}, 0},
		{[]uint64{4}, 1},
	} {
		if got := h.run(tc.keys); got != tc.want {
			t.Errorf("run(%v) = %d, want %d", tc.keys, got, tc.want)
		}
	}
	if newHostTier(0) != nil || newHostTier(-5) != nil {
		t.Fatal("a tier of no capacity must be nil (no host tier)")
	}
}

func TestOffloadPreset(t *testing.T) {
	off, err := PresetConfig("llama-8b-h100-offload")
	if err != nil {
		t.Fatal(err)
	}
	if off.HostBlocks != 125000 || off.HostBlocks*off.BlockSize != 2_000_000 || off.HostLoadTokenMs != 0.005 {
		t.Fatalf("offload host tier: %d blocks × %d, %v ms/token", off.HostBlocks, off.BlockSize, off.HostLoadTokenMs)
	}
	base, _ := PresetConfig("llama-8b-h100")
	if base.HostBlocks != 0 {
		t.Fatalf("llama-8b-h100 has a host tier of %d blocks", base.HostBlocks)
	}
	off.Preset, base.Preset = "", ""
	off.HostBlocks = 0
	if off != base {
		t.Fatalf("offload preset differs beyond its host tier:\n%+v\n%+v", off, base)
	}
	if !slices.Contains(Presets(), "llama-8b-h100-offload") {
		t.Fatalf("Presets() = %v", Presets())
	}
	for _, name := range Presets() {
		if p, _ := PresetConfig(name); name != "llama-8b-h100-offload" && p.HostBlocks != 0 {
			t.Errorf("preset %s has a host tier", name)
		}
	}

	for _, tc := range []struct {
		name       string
		cfg        Config
		wantBlocks int
		wantLoadMs float64
	}{
		{"default preset has none", Config{}, 0, 0.005},
		{"offload preset", Config{Preset: "llama-8b-h100-offload"}, 125000, 0.005},
		{"negative blocks disable", Config{Preset: "llama-8b-h100-offload", HostBlocks: -1}, 0, 0.005},
		{"explicit blocks", Config{HostBlocks: 7, HostLoadTokenMs: 0.5}, 7, 0.5},
		{"negative load cost is zero", Config{Preset: "llama-8b-h100-offload", HostLoadTokenMs: -1}, 125000, 0},
	} {
		rc, err := tc.cfg.resolve()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if rc.HostBlocks != tc.wantBlocks || rc.HostLoadTokenMs != tc.wantLoadMs {
			t.Errorf("%s: HostBlocks %d, HostLoadTokenMs %v; want %d, %v", tc.name, rc.HostBlocks, rc.HostLoadTokenMs, tc.wantBlocks, tc.wantLoadMs)
		}
	}

	rep, err := NewReplica(Config{Preset: "llama-8b-h100-offload"})
	if err != nil {
		t.Fatal(err)
	}
	defer rep.Close()
	if st := rep.Stats(); st.HostBlocks != 125000 || st.HostCachedBlocks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// hostTestConfig is fastConfig with an expensive prefill (0.2 ms/token) so
// that a host-tier load (0.005 ms/token) is clearly cheaper than a
// recompute, a 40-block GPU cache, and a host tier of hostBlocks blocks.
func hostTestConfig(hostBlocks int) func(*Config) {
	return func(c *Config) {
		c.NumGPUBlocks = 40
		c.PrefillTokenMs = 0.2
		c.CachedTokenFrac = 0.03
		c.HostLoadTokenMs = 0.005
		c.HostBlocks = hostBlocks
	}
}

// ttftRun streams a completion of p with max_tokens 1 and returns its
// real-time TTFT, its cached_tokens and the simulated busy time it added.
func ttftRun(t *testing.T, rep *Replica, url, p string) (ttft time.Duration, cached int, busy time.Duration) {
	t.Helper()
	before := rep.Stats().BusyTime
	start := time.Now()
	evs := streamReq(context.Background(), t, url, "/v1/completions", map[string]any{
		"prompt": p, "max_tokens": 1, "ignore_eos": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	if len(evs) != 3 || evs[2].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	var c completion
	if err := json.Unmarshal([]byte(evs[1].data), &c); err != nil || c.Usage == nil {
		t.Fatalf("usage event %q: %v", evs[1].data, err)
	}
	return evs[0].at.Sub(start), c.Usage.PromptTokensDetails.CachedTokens, rep.Stats().BusyTime - before
}

// TestHostTierHits runs a prompt P, then filler prompts that evict P's
// blocks from a 40-block GPU cache, then P again, on a replica with a host
// tier and on one without.
func TestHostTierHits(t *testing.T) {
	const bs = 16
	tests := []struct {
		name        string
		promptBytes int // P's size; P is 513 or 512 tokens
		fillers     int // 33-block prompts run between the two runs of P
		hostBlocks  int
		wantGPU     int // hit tokens of the second run of P
		wantHost    int
	}{
		// One filler evicts P's blocks 7..31 (the tail goes first); the
		// GPU run of 7 blocks continues with 25 blocks in the host tier.
		{"tail evicted", 32*64 + 2, 1, 1000, 7 * bs, 25 * bs},
		// Two fillers evict all of P: the whole run comes from the host.
		{"all evicted", 32*64 + 2, 2, 1000, 0, 32 * bs},
		// 32 whole blocks, no partial one: the last token is always
		// computed, so host hits stop at 31 blocks, as GPU hits do.
		{"exact blocks", 32 * 64, 2, 1000, 0, 31 * bs},
		// A 72-block host tier evicts 24 of P's blocks for the second
		// filler. P was written through tail first, so its head survives:
		// 8 leading blocks still hit.
		{"host tier keeps the head of a prefix", 32*64 + 2, 2, 72, 0, 8 * bs},
		// A 40-block host tier holds only the fillers' keys by then.
		{"host tier too small", 32*64 + 2, 2, 40, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host, hostURL := startReplica(t, hostTestConfig(tc.hostBlocks))
			plain, plainURL := startReplica(t, hostTestConfig(0))
			cfg := host.Config()
			p := prompt("P", tc.promptBytes)
			T := numTokens(tc.promptBytes)

			// Cold runs cost the same with and without a host tier.
			coldTTFT, cached, coldBusy := ttftRun(t, plain, plainURL, p)
			_, hcached, hcoldBusy := ttftRun(t, host, hostURL, p)
			if cached != 0 || hcached != 0 || coldBusy != hcoldBusy {
				t.Fatalf("cold runs: cached %d/%d, busy %v (plain) vs %v (host tier)", cached, hcached, coldBusy, hcoldBusy)
			}
			for i := range tc.fillers {
				f := map[string]any{"prompt": prompt("F"+string(rune('a'+i)), 32*64+2), "max_tokens": 1}
				complete(t, plainURL, f)
				complete(t, hostURL, f)
			}

			// Without a host tier only the GPU leftovers hit.
			plainTTFT, cached, _ := ttftRun(t, plain, plainURL, p)
			if cached != tc.wantGPU {
				t.Fatalf("no host tier: cached %d, want %d", cached, tc.wantGPU)
			}
			hostTTFT, cached, busy := ttftRun(t, host, hostURL, p)
			if cached != tc.wantGPU+tc.wantHost {
				t.Fatalf("host tier: cached %d, want %d GPU + %d host", cached, tc.wantGPU, tc.wantHost)
			}
			// One step: load the host hits, prefill the rest.
			hit := tc.wantGPU + tc.wantHost
			wantMs := cfg.StepBaseMs + cfg.prefillMs(T-hit, hit) + cfg.cachedMs(tc.wantGPU) + cfg.hostLoadMs(tc.wantHost)
			if got := float64(busy) / float64(time.Millisecond); math.Abs(got-wantMs) > 1e-3 {
				t.Fatalf("step cost %.4f ms, want %.4f ms", got, wantMs)
			}

			// Queries: P cold, the fillers, P again. The host tier is
			// queried for every token not hit on GPU.
			st := host.Stats()
			fill := int64(513 * tc.fillers)
			wantQ, wantHostQ := 2*int64(T)+fill, int64(T)+fill+int64(T-tc.wantGPU)
			if st.QueryTokens != wantQ || st.HostQueryTokens != wantHostQ ||
				st.HitTokens != int64(tc.wantGPU) || st.HostHitTokens != int64(tc.wantHost) {
				t.Fatalf("queries %d, host queries %d, hits %d, host hits %d; want %d, %d, %d, %d",
					st.QueryTokens, st.HostQueryTokens, st.HitTokens, st.HostHitTokens,
					wantQ, wantHostQ, tc.wantGPU, tc.wantHost)
			}
			if st.ReuseHitTokens() != int64(hit) || st.ReuseHitRate() != float64(hit)/float64(st.QueryTokens) ||
				st.HitRate() != float64(tc.wantGPU)/float64(st.QueryTokens) {
				t.Fatalf("reuse %d %v, hit rate %v: %+v", st.ReuseHitTokens(), st.ReuseHitRate(), st.HitRate(), st)
			}
			if want := min(tc.hostBlocks, 32*(1+tc.fillers)); st.HostBlocks != tc.hostBlocks || st.HostCachedBlocks != want {
				t.Fatalf("host tier holds %d of %d blocks, want %d", st.HostCachedBlocks, st.HostBlocks, want)
			}
			if ps := plain.Stats(); ps.HostQueryTokens != 0 || ps.HostHitTokens != 0 || ps.HostBlocks != 0 || ps.ReuseHitRate() != ps.HitRate() {
				t.Fatalf("no host tier: %+v", ps)
			}

			if tc.wantHost > 0 {
				// Loading from host memory beats recomputing.
				if hostTTFT >= coldTTFT || hostTTFT >= plainTTFT {
					t.Fatalf("TTFT with host hits %v, cold %v, without host tier %v", hostTTFT, coldTTFT, plainTTFT)
				}
				t.Logf("TTFT: host tier %v, cold %v, no host tier %v", hostTTFT, coldTTFT, plainTTFT)
			}

			// The blocks of the second run, loaded or computed, were
			// registered in the GPU cache: the next run hits them all on
			// GPU (all but the last token).
			all := (T - 1) / bs * bs
			if _, cached, _ := ttftRun(t, host, hostURL, p); cached != all {
				t.Fatalf("third run: cached %d, want %d", cached, all)
			}
			if st2 := host.Stats(); st2.HitTokens-st.HitTokens != int64(all) || st2.HostHitTokens != st.HostHitTokens {
				t.Fatalf("third run: GPU hits +%d, host hits +%d; want +%d, +0",
					st2.HitTokens-st.HitTokens, st2.HostHitTokens-st.HostHitTokens, all)
			}

			// Metrics: external counters only with a host tier.
			st = host.Stats()
			vals, labels := scrape(t, hostURL)
			for name, want := range map[string]float64{
				"vllm:prefix_cache_queries_total":          float64(st.QueryTokens),
				"vllm:prefix_cache_hits_total":             float64(st.HitTokens),
				"vllm:external_prefix_cache_queries_total": float64(st.HostQueryTokens),
				"vllm:external_prefix_cache_hits_total":    float64(st.HostHitTokens),
			} {
				if got, ok := vals[name]; !ok || got != want {
					t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
				}
			}
			if got := labels["vllm:cache_config_info"][0]["num_cpu_blocks"]; got != strconv.Itoa(tc.hostBlocks) {
				t.Errorf("num_cpu_blocks %q", got)
			}
			vals, labels = scrape(t, plainURL)
			for name := range vals {
				if strings.HasPrefix(name, "vllm:external_") {
					t.Errorf("%s exported without a host tier", name)
				}
			}
			if _, ok := vals["vllm:prefix_cache_hits_total"]; !ok {
				t.Error("prefix_cache_hits_total missing")
			}
			if got := labels["vllm:cache_config_info"][0]["num_cpu_blocks"]; got != "0" {
				t.Errorf("num_cpu_blocks %q without a host tier", got)
			}
		})
	}
}
