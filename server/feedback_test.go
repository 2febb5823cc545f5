package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// An engine that reports fewer cached tokens than kvroute predicted trims
// the index: continuations of the prompt past what the engine found stop
// counting as cached on that replica, both for answers read whole and for
// streams (whose usage comes in the last event).
func TestEngineFeedbackTrimsTheIndex(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var report atomic.Int64 // cached tokens the engine reports
			report.Store(1 << 30)   // at least the prediction: nothing to trim
			engine := func(w http.ResponseWriter, _ *http.Request) {
				usage := fmt.Sprintf(`{"prompt_tokens":5000,"completion_tokens":1,"total_tokens":5001,"prompt_tokens_details":{"cached_tokens":%d}}`, min(report.Load(), 5000))
				if stream {
					w.Header().Set("Content-Type", "text/event-stream")
					_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				_, _ = fmt.Fprintf(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":%s}`, usage)
			}
			a := kvtest.NewReplica(t, "a", engine)
			k := kvtest.Start(t, []*kvtest.Replica{a}, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
			sys := strings.Repeat("You answer questions about the fleet. ", 60)
			history := strings.Repeat("the first turn says this and that. ", 60)
			body := func(user string) string {
				b, _ := json.Marshal(map[string]any{"model": "m1", "stream": stream,
					"messages": []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": user}}})
				return string(b)
			}
			probe := func(b string) int {
				t.Helper()
				resp, out := postJSON(t, k.Admin+"/debug/route", b)
				if resp.StatusCode != 200 {
					t.Fatalf("/debug/route: %d %s", resp.StatusCode, out)
				}
				var d struct{ Matched int }
				if err := json.Unmarshal(out, &d); err != nil {
					t.Fatal(err)
				}
				return d.Matched
			}
			send := func(b string) {
				t.Helper()
				resp, out := postJSON(t, k.URL+"/v1/chat/completions", b)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, out)
				}
			}
			first := body(history)
			branch := body(history + " and a branch that goes on: " + strings.Repeat("branch words here. ", 40))
			send(first)
			send(branch)
			before, shared := probe(branch), probe(first)
			if before <= shared || shared < 512 {
				t.Fatalf("before any report the branch is held for %d tokens and the first prompt for %d: want both, the branch longer", before, shared)
			}
			// A third prompt continues the first; the engine found only the
			// system prompt of it: the rest was evicted.
			report.Store(256)
			send(body(history + " then a third question."))
			after := probe(branch)
			if after >= before {
				t.Errorf("after the engine's report the branch is held for %d tokens, was %d: want fewer", after, before)
			}
			// What the third prompt shares with the branch was just
			// prefilled again: still held.
			if got := probe(first); got != shared {
				t.Errorf("the first prompt, shared with the one just prefilled, is held for %d tokens, was %d", got, shared)
			}
			if after < shared {
				t.Errorf("the branch is held for %d tokens, less than what it shares with the prompt just prefilled (%d)", after, shared)
			}
			if n := k.Srv.Index().Trims(); n != 1 {
				t.Errorf("trims %d, want 1", n)
			}
			if got := scrape(t, k.Admin)["kvroute_index_trims_total"]; len(got) != 1 || got[0].value != 1 {
				t.Errorf("/metrics kvroute_index_trims_total: %v, want 1", got)
			}
		})
	}
}
