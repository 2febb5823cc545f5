package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/oai"
)

const preciseModel = "sim-precise"

// preciseFleet starts n simulated vLLM replicas publishing their KV events,
// and a kvroute in precise mode in front of them (renders from replica 0).
func preciseFleet(t testing.TB, n int, opts ...kvtest.Option) (*sim.Fleet, *kvtest.KV) {
	t.Helper()
	return preciseRanks(t, n, 1, opts...)
}

// preciseRanks is preciseFleet of n servers of ranks data-parallel engines
// each, every server one backend of kvroute's with data_parallel_size
// ranks.
func preciseRanks(t testing.TB, n, ranks int, opts ...kvtest.Option) (*sim.Fleet, *kvtest.KV) {
	t.Helper()
	f, err := sim.StartFleet(context.Background(), n, 0, sim.Config{
		Preset: "llama-8b-h100", Model: preciseModel, NumGPUBlocks: 4000, BlockSize: 16,
		StepBaseMs: 1, DecodeSeqMs: -1, DecodeCtxMs: -1, PrefillTokenMs: 0.0001, PrefillCtxMs: -1, PrefillAttnMs: -1,
		CachedTokenFrac: -1, WatermarkFrac: -1,
		KVEvents: true, KVEventsEncoding: "tagged", DataParallelSize: ranks,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	evs := f.KVEvents()
	cfg := func(cfg *config.Config) {
		cfg.Policy = "cache_aware"
		cfg.Backends = nil
		for i := range n {
			// Rank 0 of a server publishes on the ports its other ranks'
			// are offset from.
			ev := evs[i*ranks]
			cfg.Backends = append(cfg.Backends, config.Backend{Name: fmt.Sprintf("sim-%d", i), URL: f.URLs[i*ranks], Engine: "vllm",
				KVEvents:         &config.KVEvents{Endpoint: ev.Endpoint, ReplayEndpoint: ev.ReplayEndpoint, Topic: ev.Topic},
				DataParallelSize: ranks})
		}
		// The other precise settings keep their defaults (prefix_turns).
		cfg.Precise.RenderURL, cfg.Precise.RenderTimeout, cfg.Precise.RenderCacheBytes = f.URLs[0], 2*time.Second, 1<<20
	}
	// A replica turns precise once its first events are applied: an idle
	// engine publishes none.
	return f, kvtest.Start(t, nil, append([]kvtest.Option{cfg}, opts...)...)
}

func preciseChat(conv, turns int) string {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You answer questions about the fleet. ", 40)}}
	for i := 0; i < turns; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d question %d: %s", conv, i, strings.Repeat("tell me more. ", 20))},
			map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d: %s", i, strings.Repeat("here it is. ", 20))})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d question %d: %s", conv, turns, strings.Repeat("tell me more. ", 20))})
	b, _ := json.Marshal(map[string]any{"model": preciseModel, "messages": msgs, "max_tokens": 8})
	return string(b)
}

// preciseTurn sends turn turn of conversation conv (preciseChat) and
// waits for the engine events it causes; it returns the replica and the
// route kvroute named, and the answer.
func preciseTurn(t *testing.T, k *kvtest.KV, conv, turn int) (backend, route string, answer []byte) {
	t.Helper()
	before := engineWrites(k)
	resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(conv, turn))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	kvtest.WaitFor(t, 10*time.Second, "the turn's events", func() bool { return engineWrites(k) > before })
	return resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route"), out
}

// engineWrites is the Index's writes from engine events.
func engineWrites(k *kvtest.KV) uint64 { return k.Srv.Router.Index().Writes(index.SourceEngine) }

// In precise mode the turns of a conversation are routed on the engine's
// own tokens: after the first turn the replica's events put the exact key
// in the Index and the next turns hit it there, on the replica that holds
// it, and say so.
func TestPreciseConversation(t *testing.T) {
	_, k := preciseFleet(t, 3)
	homes := map[string]bool{}
	for c := 0; c < 3; c++ {
		home := ""
		for turn := 0; turn < 4; turn++ {
			got, route, _ := preciseTurn(t, k, c, turn)
			if turn == 0 {
				home = got
				homes[got] = true
			} else {
				if got != home {
					t.Errorf("conversation %d turn %d went to %s (%s), its first turn to %s", c, turn, got, route, home)
				}
				if !strings.Contains(route, "cache_hit") || !strings.HasSuffix(route, " precise") {
					t.Errorf("conversation %d turn %d routed %q, want a precise cache hit", c, turn, route)
				}
			}
		}
	}
	var states []struct {
		Name          string `json:"name"`
		Mode          string `json:"mode"`
		RecentPrefill int64  `json:"recent_prefill_tokens"`
	}
	getJSON(t, k.Admin+"/debug/backends", &states)
	for _, s := range states {
		if want := homes[s.Name]; want && s.Mode != "precise" || !want && s.Mode == "" {
			t.Errorf("%s mode %q in /debug/backends (served a conversation: %v)", s.Name, s.Mode, want)
		}
		if served := homes[s.Name]; served != (s.RecentPrefill > 0) {
			t.Errorf("%s: %d recent prefill tokens in /debug/backends (served a conversation: %v)", s.Name, s.RecentPrefill, served)
		}
	}
	m := scrape(t, k.Admin)
	if got := total(m["kvroute_precise_renders_total"]); got < 12 {
		t.Errorf("%v renders counted, want at least the 12 turns", got)
	}
	if got := total(m["kvroute_backend_precise"]); got != float64(len(homes)) {
		t.Errorf("kvroute_backend_precise sums to %v, want the %d replicas that served", got, len(homes))
	}
	// Every followed replica's left-out blocks are counted, by reason;
	// the simulated engines' events all place.
	if left := m["kvroute_kv_events_left_out_total"]; len(left) != 3*len(m["kvroute_backend_precise"]) || total(left) != 0 {
		t.Errorf("kvroute_kv_events_left_out_total: %d series summing to %v, want 3 a replica at 0", len(left), total(left))
	}
}

// An engine of two data-parallel ranks behind one URL is two replicas:
// each rank's events feed its own, and a conversation's turns are pinned
// to the rank that holds its prefix, which the engine's answers (their
// ids name the rank that served) confirm.
func TestPreciseDataParallelRanks(t *testing.T) {
	f, k := preciseRanks(t, 1, 2)
	homes := map[string]int{}
	for c := 0; c < 4; c++ {
		home := ""
		for turn := 0; turn < 3; turn++ {
			got, route, out := preciseTurn(t, k, c, turn)
			var answer struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(out, &answer); err != nil {
				t.Fatal(err)
			}
			if got != "sim-0-dp0" && got != "sim-0-dp1" {
				t.Fatalf("routed to %q, not a rank of sim-0", got)
			}
			if !strings.Contains(answer.ID, got+"-") {
				t.Errorf("kvroute chose %s but engine %s answered", got, answer.ID)
			}
			if turn == 0 {
				home = got
				homes[got]++
			} else if got != home || !strings.Contains(route, "cache_hit") || !strings.HasSuffix(route, " precise") {
				t.Errorf("conversation %d turn %d went to %s (%s), its first turn to %s", c, turn, got, route, home)
			}
		}
	}
	if len(homes) != 2 {
		t.Errorf("conversations by rank %v, want both ranks used", homes)
	}
	served := 0
	for _, rep := range f.Replicas {
		served += int(rep.Stats().Requests)
	}
	if served != 12 {
		t.Errorf("the engines served %d requests, want 12", served)
	}
	var states []struct {
		Name string `json:"name"`
		Mode string `json:"mode"`
		Rank *int   `json:"data_parallel_rank"`
	}
	getJSON(t, k.Admin+"/debug/backends", &states)
	for _, s := range states {
		if s.Mode != "precise" || s.Rank == nil || s.Name != fmt.Sprintf("sim-0-dp%d", *s.Rank) {
			t.Errorf("%s mode %q rank %v, want precise and its rank", s.Name, s.Mode, s.Rank)
		}
	}
}

// A cut event stream loses no request: the replica's requests keep being
// served while its events are withheld, and once restored the replay fills
// the gap.
func TestPreciseEventsCutAndRestored(t *testing.T) {
	f, k := preciseFleet(t, 2)
	// Both replicas serve once and turn precise; then their events stop.
	for c := 10; c < 12; c++ {
		if resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(c, 0)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	for _, r := range f.Replicas {
		r.CutKVEvents()
	}
	for c := 0; c < 4; c++ {
		for turn := 0; turn < 2; turn++ {
			resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(c, turn))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d while the events are cut: %s", resp.StatusCode, out)
			}
		}
	}
	before := engineWrites(k)
	for _, r := range f.Replicas {
		r.RestoreKVEvents()
	}
	// The next batch shows the gap; the replay gives back what was cut.
	resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(9, 0))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	kvtest.WaitFor(t, 10*time.Second, "a replay", func() bool { return total(scrape(t, k.Admin)["kvroute_kv_events_replays_total"]) > 0 })
	kvtest.WaitFor(t, 10*time.Second, "the replayed events", func() bool { return engineWrites(k) > before+3 })
	// The conversations served during the cut are known again: their next
	// turns are served, and hit (precisely, unless their replica is still
	// catching up at that moment).
	precise := 0
	for c := 0; c < 4; c++ {
		resp, out = postJSON(t, k.URL+"/v1/chat/completions", preciseChat(c, 2))
		route := resp.Header.Get("X-Kvroute-Route")
		if resp.StatusCode != 200 {
			t.Errorf("conversation %d after the restore: status %d, route %q: %s", c, resp.StatusCode, route, out)
		}
		if strings.Contains(route, "matched=") && !strings.Contains(route, "matched=0") && strings.HasSuffix(route, " precise") {
			precise++
		}
	}
	if precise == 0 {
		t.Error("no turn after the restore hit precisely")
	}
}

// A render that does not answer within precise.render_timeout leaves the
// request to the approximate key: it is served, and the fallback counted.
func TestPreciseRenderTimeoutFallsBack(t *testing.T) {
	// The renderer is slow until it is given the sim's render endpoints.
	var renderer atomic.Pointer[http.Handler]
	var slow *kvtest.Replica
	slow = kvtest.NewReplica(t, "slow-render", func(w http.ResponseWriter, r *http.Request) {
		if h := renderer.Load(); h != nil {
			// The fake replica has read the body; renders come one at a time.
			_, body := slow.LastRequest()
			r.Body = io.NopCloser(bytes.NewReader(body))
			(*h).ServeHTTP(w, r)
			return
		}
		select {
		case <-time.After(2 * time.Second):
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	f, k := preciseFleet(t, 2, func(cfg *config.Config) {
		cfg.Precise.RenderURL, cfg.Precise.RenderTimeout = slow.URL(), 30*time.Millisecond
	})
	before := engineWrites(k)
	resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(1, 0))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if route := resp.Header.Get("X-Kvroute-Route"); strings.Contains(route, "precise") {
		t.Errorf("routed %q without exact tokens", route)
	}
	m := scrape(t, k.Admin)
	timeouts := 0.0
	for _, s := range m["kvroute_precise_fallbacks_total"] {
		if s.labels["reason"] == "timeout" {
			timeouts += s.value
		}
	}
	if timeouts < 1 {
		t.Errorf("no timeout fallback counted: %+v", m["kvroute_precise_fallbacks_total"])
	}

	// The replica that served is followed live, but with renders failing
	// no replica is precise.
	served := resp.Header.Get("X-Kvroute-Backend")
	kvtest.WaitFor(t, 10*time.Second, "the request's events", func() bool { return engineWrites(k) > before })
	modes := func() map[string]string { return backendModes(t, k) }
	if got := modes(); got[served] != "approximate degraded render_failing" {
		t.Errorf("modes %v while renders fail", got)
	}
	gauge := func() map[string]string { return routingGauge(t, k) }
	if got := gauge(); got[served] != "degraded render_failing" {
		t.Errorf("kvroute_backend_routing_state %v while renders fail", got)
	}
	if got := total(scrape(t, k.Admin)["kvroute_backend_precise"]); got != 0 {
		t.Errorf("kvroute_backend_precise sums to %v while renders fail", got)
	}

	// Once renders succeed again, the live replica is precise.
	h := f.Replicas[0].Handler()
	renderer.Store(&h)
	resp, out = postJSON(t, k.URL+"/v1/chat/completions", preciseChat(1, 1))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if got := modes(); got[served] != "precise exact " {
		t.Errorf("modes %v once renders succeed (%s served, routed %q)", got, served, resp.Header.Get("X-Kvroute-Route"))
	}
}

// backendModes gives each replica's mode, routing state and reason, as
// /debug/backends shows them ("precise exact ").
func backendModes(t *testing.T, k *kvtest.KV) map[string]string {
	t.Helper()
	var states []struct {
		Name         string `json:"name"`
		Mode         string `json:"mode"`
		RoutingState struct {
			State  string `json:"state"`
			Reason string `json:"reason"`
		} `json:"routing_state"`
	}
	getJSON(t, k.Admin+"/debug/backends", &states)
	out := map[string]string{}
	for _, s := range states {
		out[s.Name] = s.Mode + " " + s.RoutingState.State + " " + s.RoutingState.Reason
	}
	return out
}

// routingGauge gives each replica's kvroute_backend_routing_state labels
// ("degraded render_failing").
func routingGauge(t *testing.T, k *kvtest.KV) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, s := range scrape(t, k.Admin)["kvroute_backend_routing_state"] {
		out[s.labels["backend"]] = s.labels["state"] + " " + s.labels["reason"]
	}
	return out
}

func total(ss []sample) float64 {
	var v float64
	for _, s := range ss {
		v += s.value
	}
	return v
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := httpGet(t, http.DefaultClient, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkPreciseNextTurn measures what precise mode adds to routing a
// conversation's next turn: Prepare (the approximate key, the exact tokens
// from a simulated replica's renderer over loopback, or from the previous
// turn's render, the exact key) and Route, for 32 conversations of about
// 6,000 tokens their replicas hold. Each round sends every conversation's
// next turn (its last answer and a new question on), each turn new (no
// render cache hit); between rounds the answers take 20 ms. The first round
// is not timed. It reports the
// p50 and p99 of one decision, the share of decisions made on exact tokens,
// and, for comparison, the same with precise mode off.
func BenchmarkPreciseNextTurn(b *testing.B) {
	const convs = 32
	histories := make([][]map[string]string, convs)
	for c := range histories {
		histories[c] = preciseHistory(c, 12)
	}
	for _, mode := range []string{"precise", "approximate"} {
		b.Run(mode, func(b *testing.B) {
			k := benchFleet(b, mode)
			// Each conversation's turn so far, to its last question, served
			// once: its replica holds it.
			for _, h := range histories {
				serveTurn(b, k, mode, nextTurn(h[:len(h)-1], -1))
			}
			var bufs oai.Buffers
			// One round untimed: a process's first next turns wait for their
			// own render until the renderer has shown PrefixAfter stable ones.
			for _, h := range histories {
				decideTimed(b, k, &bufs, []byte(laterTurn(h, 0)))
			}
			took := make([]time.Duration, 0, b.N)
			precise := 0
			prefixed := prefixRenders(b, k)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				round, c := 1+i/convs, i%convs
				if c == 0 {
					b.StopTimer()
					time.Sleep(20 * time.Millisecond) // the last round's answers
					b.StartTimer()
				}
				d, exact := decideTimed(b, k, &bufs, []byte(laterTurn(histories[c], round)))
				took = append(took, d)
				if exact {
					precise++
				}
			}
			b.StopTimer()
			reportDecisions(b, took, precise)
			prefixed = prefixRenders(b, k) - prefixed
			b.ReportMetric(prefixed/float64(b.N), "prefix/op")
			if mode == "precise" && prefixed == 0 {
				b.Fatal("no next turn was answered from its previous turn's render")
			}
		})
	}
}

// prefixRenders is k's kvroute_precise_renders_total{result="prefix"}.
func prefixRenders(b *testing.B, k *kvtest.KV) float64 {
	return sum(scrape(b, k.Admin), "kvroute_precise_renders_total", "result", "prefix")
}

// serveTurn serves the chat request body through k and, in mode
// "precise", waits until the replica's events of it are in the Index.
func serveTurn(b *testing.B, k *kvtest.KV, mode, body string) {
	before := engineWrites(k)
	if resp, out := postJSON(b, k.URL+"/v1/chat/completions", body); resp.StatusCode != 200 {
		b.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if mode == "precise" {
		kvtest.WaitFor(b, 10*time.Second, "the conversation's events", func() bool { return engineWrites(k) > before })
	}
}

// benchFleet is preciseFleet of 4 replicas with the default render cache
// (preciseFleet's 1 MiB holds one render of each of 32
// conversations of 6,000 tokens, and evicts some while a turn's
// background render and its previous turn's are both held), with precise
// mode off when mode is "approximate".
func benchFleet(b *testing.B, mode string) *kvtest.KV {
	opts := []kvtest.Option{func(cfg *config.Config) { cfg.Precise.RenderCacheBytes = config.Default().Precise.RenderCacheBytes }}
	if mode == "approximate" {
		opts = append(opts, func(cfg *config.Config) { cfg.Precise.RenderURL = "" })
	}
	_, k := preciseFleet(b, 4, opts...)
	return k
}

// decideTimed makes k's decision for the chat request body, undoes it,
// and returns how long it took and whether it was made on exact tokens.
func decideTimed(b *testing.B, k *kvtest.KV, bufs *oai.Buffers, body []byte) (time.Duration, bool) {
	start := time.Now()
	dec, err := k.Srv.Decide(bufs, oai.KindChat, body, nil)
	took := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	defer dec.Undo()
	return took, strings.HasSuffix(dec.Reason, " precise")
}

// reportDecisions reports the p50 and p99 of the decisions' times took
// and the share of them made on exact tokens, precise of b.N.
func reportDecisions(b *testing.B, took []time.Duration, precise int) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(precise)/float64(b.N), "precise/op")
}

// BenchmarkPreciseFirstTurn measures what precise mode adds to routing a
// conversation's first turn, which no earlier render helps with: Prepare
// (the approximate key of text the tokenizer has not seen, and the exact
// tokens a simulated replica renders over loopback, made at the same time)
// and Route, for one new user message of about 16,000 of the replica's
// tokens per decision, once 8 conversations were served. It reports the
// p50 and p99 of one decision, the share made on exact tokens, and the
// same with precise mode off.
func BenchmarkPreciseFirstTurn(b *testing.B) {
	words := strings.Fields("fleet replica prefix cache token route queue engine render event block memory prompt answer tool model batch")
	for _, mode := range []string{"precise", "approximate"} {
		b.Run(mode, func(b *testing.B) {
			k := benchFleet(b, mode)
			// Conversations served first, so that replicas have published
			// events and are precise.
			for c := range 8 {
				serveTurn(b, k, mode, nextTurn(preciseHistory(c, 1), -1))
			}
			rng := rand.New(rand.NewPCG(uint64(b.N), 7))
			bodies := make([][]byte, b.N)
			for i := range bodies {
				var text strings.Builder
				for text.Len() < 64<<10 {
					fmt.Fprintf(&text, "%s %d ", words[rng.IntN(len(words))], rng.IntN(1e6))
				}
				bodies[i], _ = json.Marshal(map[string]any{"model": preciseModel, "max_tokens": 8,
					"messages": []map[string]string{{"role": "user", "content": text.String()}}})
			}
			var bufs oai.Buffers
			took := make([]time.Duration, 0, b.N)
			precise := 0
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				d, exact := decideTimed(b, k, &bufs, bodies[i])
				took = append(took, d)
				if exact {
					precise++
				}
			}
			b.StopTimer()
			reportDecisions(b, took, precise)
		})
	}
}

// laterTurn is history followed by turns exchanges and question turns: the
// conversation's turn turns+1 after history's.
func laterTurn(history []map[string]string, turns int) string {
	msgs := slices.Clip(history)
	for j := range turns {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("next question %d: what then?", j)},
			map[string]string{"role": "assistant", "content": fmt.Sprintf("then %d: %s", j, strings.Repeat("this follows. ", 30))})
	}
	return nextTurn(msgs, turns)
}

// preciseHistory is conversation conv: turns exchanges of about 500
// tokens each, after a shared system prompt.
func preciseHistory(conv, turns int) []map[string]string {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You answer questions about the fleet. ", 40)}}
	for i := 0; i < turns; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d question %d: %s", conv, i, strings.Repeat("tell me more about it. ", 40))},
			map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d: %s", i, strings.Repeat("here it is, in detail. ", 45))})
	}
	return msgs
}

// nextTurn is history followed by a new question n (-1: none).
func nextTurn(history []map[string]string, n int) string {
	msgs := history
	if n >= 0 {
		msgs = append(slices.Clip(history), map[string]string{"role": "user", "content": fmt.Sprintf("next question %d: what then?", n)})
	}
	b, _ := json.Marshal(map[string]any{"model": preciseModel, "messages": msgs, "max_tokens": 8})
	return string(b)
}
