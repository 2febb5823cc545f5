package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/race"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/server"
)

// conversationBody renders a chat body of turns user/assistant pairs of
// about perTurn bytes each behind a shared system prompt.
func conversationBody(turns, perTurn int) []byte {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are a careful assistant. ", 40)}}
	for i := 0; i < turns; i++ {
		msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("question %d: %s", i, strings.Repeat("how does the cache work? ", perTurn/25))})
		msgs = append(msgs, map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d: %s", i, strings.Repeat("it keeps prefixes warm. ", perTurn/24))})
	}
	b, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs, "stream": true})
	return b
}

func hotPathServer(tb testing.TB) *server.Server {
	cfg := config.Default()
	for i := 0; i < 8; i++ {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 21000+i), Engine: "vllm"})
	}
	srv, err := server.Build(cfg, zap.NewNop())
	if err != nil {
		tb.Fatal(err)
	}
	return srv
}

// parseBufs is reused across route calls, as the proxy reuses pooled ones.
var parseBufs oai.Buffers

// route runs the routing path of one request (server.Decide: the proxy's
// Router.Prepare, Route and Release): parse the routing fields, build the
// key (tokenize, with caches), match, score and record.
func route(srv *server.Server, body []byte) {
	d, err := srv.Decide(&parseBufs, oai.KindChat, body, nil)
	if err != nil {
		panic(err)
	}
	d.Started() // as the proxy does once the replica answers
}

// BenchmarkRoutingPath measures the whole routing decision of a request whose
// earlier turns were seen before (caches warm), by conversation size.
func BenchmarkRoutingPath(b *testing.B) {
	for _, kb := range []int{2, 32, 128} {
		b.Run(fmt.Sprintf("body=%dKB", kb), func(b *testing.B) {
			srv := hotPathServer(b)
			body := conversationBody(10, kb*1024/20)
			route(srv, body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				route(srv, body)
			}
		})
	}
}

// The routing path's allocations stay within a budget that does not grow
// with the prompt: parsing reuses pooled buffers, the key is built from
// cached tokens into a pooled buffer, and the decision records without
// copying the key again.
func TestRoutingPathAllocationBudget(t *testing.T) {
	srv := hotPathServer(t)
	for _, turns := range []int{2, 20} {
		body := conversationBody(turns, 1500)
		route(srv, body)
		allocs := testing.AllocsPerRun(50, func() { route(srv, body) })
		budget := 4.0 // per request, whatever the number of messages
		if race.Enabled {
			budget = 16 // -race drops pooled buffers at random
		}
		if allocs > budget {
			t.Errorf("%d turns: %.0f allocations per routing decision, budget %.0f", turns, allocs, budget)
		}
	}
}

// BenchmarkRoutingPathMultiTurn routes 64 conversations that each grow by a
// user and an assistant message per turn up to about 32 KB, round after
// round, like `kvroute bench overhead`'s multi-turn scenario: every request
// brings two messages the tokenizer has not seen.
func BenchmarkRoutingPathMultiTurn(b *testing.B) {
	srv := hotPathServer(b)
	const convs, turns = 64, 32
	bodies := make([][]byte, 0, convs*turns)
	for c := 0; c < convs; c++ {
		msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
		for t := 0; t < turns; t++ {
			msgs = append(msgs,
				map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d turn %d: %s", c, t, strings.Repeat("please explain the next step ", 17))},
				map[string]string{"role": "assistant", "content": fmt.Sprintf("reply %d/%d: %s", c, t, strings.Repeat("here is the next step in detail ", 15))})
			body, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs})
			bodies = append(bodies, body)
		}
	}
	var total int64
	for _, body := range bodies {
		total += int64(len(body))
	}
	b.SetBytes(total / int64(len(bodies)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// Turn-major order: every conversation's turn t, then turn t+1.
		j := i % len(bodies)
		route(srv, bodies[(j%convs)*turns+j/convs])
	}
}
