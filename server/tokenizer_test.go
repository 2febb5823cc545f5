package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// A renderer that tokenizes otherwise than the engine (here: one token
// more at the start, as a chat template with a second BOS would) gives
// exact keys that none of the engine's events match. kvroute sees the
// rendered lengths differ from the engine's prompt_tokens, calls the
// replica degraded (tokenizer_mismatch), routes it on the approximate key,
// and calls it exact again once the renderer agrees with the engine.
func TestPreciseTokenizerMismatch(t *testing.T) {
	var skew atomic.Bool
	skew.Store(true)
	var engine atomic.Pointer[http.Handler]
	renderer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		(*engine.Load()).ServeHTTP(rec, r)
		var out map[string]any
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		if ids, ok := out["token_ids"].([]any); ok && skew.Load() {
			out["token_ids"] = append([]any{float64(1)}, ids...)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(renderer.Close)
	f, k := preciseFleet(t, 1, func(cfg *config.Config) { cfg.Precise.RenderURL = renderer.URL })
	h := f.Replicas[0].Handler()
	engine.Store(&h)

	state := func() string { return backendModes(t, k)["sim-0"] }
	send := func(conv int) string {
		t.Helper()
		resp, out := postJSON(t, k.URL+"/v1/chat/completions", preciseChat(conv, 0))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("conversation %d: status %d: %s", conv, resp.StatusCode, out)
		}
		return resp.Header.Get("X-Kvroute-Route")
	}
	conv := 0
	for range 12 {
		send(conv)
		conv++
	}
	kvtest.WaitFor(t, 10*time.Second, "the mismatch called", func() bool { return state() == "approximate degraded tokenizer_mismatch" })
	if route := send(conv); strings.HasSuffix(route, " precise") {
		t.Errorf("routed %q on exact keys while the renderer disagrees with the engine", route)
	}
	conv++
	if gauge := routingGauge(t, k)["sim-0"]; gauge != "degraded tokenizer_mismatch" {
		t.Errorf("kvroute_backend_routing_state %q", gauge)
	}

	// The renderer fixed: once most of the latest lengths agree, the
	// replica is exact again.
	skew.Store(false)
	for range 24 {
		send(conv)
		conv++
	}
	kvtest.WaitFor(t, 10*time.Second, "the replica exact again", func() bool { return state() == "precise exact " })
}
