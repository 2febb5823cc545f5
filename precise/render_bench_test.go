package precise

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/tokenize"
)

// renderConv builds the bodies of a growing chat conversation: a system
// prompt, then turns of an assistant answer and a user message. After
// renderConvTurns turns it starts over as a new conversation.
type renderConv struct {
	id, turn int
	msgs     []byte // the messages array so far, without its closing bracket
}

const renderConvTurns = 32

// renderConvIDs numbers the conversations of a test binary: no two have
// the same bodies.
var renderConvIDs atomic.Int64

// next returns the body of the conversation's next turn.
func (c *renderConv) next(dst []byte) []byte {
	if c.turn == 0 || c.turn == renderConvTurns {
		c.id = int(renderConvIDs.Add(1))
		c.turn = 0
		c.msgs = append(c.msgs[:0], `[{"role":"system","content":"conversation `...)
		c.msgs = strconv.AppendInt(c.msgs, int64(c.id), 10)
		c.msgs = append(c.msgs, ` `...)
		for range 6000 / 8 {
			c.msgs = append(c.msgs, `system. `...)
		}
		c.msgs = append(c.msgs, `"}`...)
	} else {
		c.msgs = append(c.msgs, `,{"role":"assistant","content":"`...)
		for range 800 / 8 {
			c.msgs = append(c.msgs, `answer. `...)
		}
		c.msgs = append(c.msgs, `"}`...)
	}
	c.msgs = append(c.msgs, `,{"role":"user","content":"question `...)
	c.msgs = strconv.AppendInt(c.msgs, int64(c.turn), 10)
	for range 400 / 8 {
		c.msgs = append(c.msgs, ` asking.`...)
	}
	c.msgs = append(c.msgs, `"}`...)
	c.turn++
	dst = append(dst[:0], `{"model":"sim-test","stream":true,"max_tokens":64,"messages":`...)
	dst = append(dst, c.msgs...)
	return append(dst, "]}"...)
}

// BenchmarkRenderNextTurn: what precise mode adds to routing a
// conversation's next turn, a render call to a sim replica on loopback
// (never a cache hit: every turn is new) plus the exact key of its
// tokens. ns/op includes building the bodies; p50-us and p99-us are of the
// render and key alone, fallback-% the calls past the deadline (20 ms).
// The sim renders with encoding/json on the same cores: most of the time
// is its own (see BenchmarkRenderClient for the router's side alone).
// With PRECISE_RENDER_URL set the renderer there is used instead of an
// in-process sim (a sim in its own process: kvroute sim --replicas 1
// --base-port 0 --model sim-test).
func BenchmarkRenderNextTurn(b *testing.B) {
	url := os.Getenv("PRECISE_RENDER_URL")
	if url == "" {
		url = renderSim(b)
	}
	r := newTestRenderer(b, RenderOptions{URL: url})
	b.Run("serial", func(b *testing.B) { renderBench(b, r, 0) })
	b.Run("parallel4xGOMAXPROCS", func(b *testing.B) { renderBench(b, r, 4) })
}

// BenchmarkRenderClient: the same against a server that answers every
// render with the same canned tokens of a 6,400-token prompt without
// reading the request: the cost on the router's side (building and
// sending the request, reading and checking the answer, the cache's
// hashes, the key) plus loopback.
func BenchmarkRenderClient(b *testing.B) {
	answer := []byte(`{"request_id":"chatcmpl-1","token_ids":[`)
	for i := range 6400 {
		if i > 0 {
			answer = append(answer, ',')
		}
		answer = strconv.AppendUint(answer, uint64(0x6d657473+i*977), 10)
	}
	answer = append(answer, `],"features":null,"sampling_params":{"max_tokens":64,"min_tokens":0,"ignore_eos":false,"seed":null},"model":"sim-test","stream":true,"stream_options":null,"cache_salt":null,"priority":0,"kv_transfer_params":null}`...)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.Copy(io.Discard, req.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	r := newTestRenderer(b, RenderOptions{URL: srv.URL})
	renderBench(b, r, 0)
}

// renderBench renders the next turns of conversations with r, one after
// another (parallel 0) or from parallel×GOMAXPROCS goroutines.
func renderBench(b *testing.B, r *Renderer, parallel int) {
	var mu sync.Mutex
	var lat []time.Duration
	var turns, tokens, fallbacks int64
	work := func(next func() bool) {
		var conv renderConv
		var body []byte
		var toks, key []uint32
		var mine []time.Duration
		var myTokens, myFallbacks int64
		for next() {
			body = conv.next(body)
			start := time.Now()
			var err error
			toks, err = r.Render(context.Background(), oai.KindChat, body, toks[:0])
			if err != nil {
				myFallbacks++
				continue
			}
			key = tokenize.AppendExactKey(key[:0], "sim-test", toks, 16)
			mine = append(mine, time.Since(start))
			myTokens += int64(len(toks))
		}
		mu.Lock()
		lat = append(lat, mine...)
		turns += int64(len(mine))
		tokens += myTokens
		fallbacks += myFallbacks
		mu.Unlock()
	}
	hits := r.Stats().CacheHits
	b.ReportAllocs()
	b.ResetTimer()
	if parallel == 0 {
		i := 0
		work(func() bool { i++; return i <= b.N })
	} else {
		b.SetParallelism(parallel)
		b.RunParallel(func(pb *testing.PB) { work(pb.Next) })
	}
	b.StopTimer()
	if st := r.Stats(); st.CacheHits != hits {
		b.Fatalf("%d cache hits: the turns are not new", st.CacheHits-hits)
	}
	if len(lat) == 0 {
		b.Fatalf("every call fell back: %+v", r.Stats())
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(q(0.50), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(float64(tokens)/float64(turns), "tokens/turn")
	b.ReportMetric(100*float64(fallbacks)/float64(turns+fallbacks), "fallback-%")
}
