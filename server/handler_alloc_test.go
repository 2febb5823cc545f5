package server_test

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/internal/race"
)

// fastUpstream is a replica that allocates nothing per request (fasthttp,
// fixed answers), so that allocations measured across a request through
// kvroute in this process are kvroute's.
func fastUpstream(t *testing.T) string {
	t.Helper()
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	answer := []byte(`{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`)
	models := []byte(`{"object":"list","data":[{"id":"m1","object":"model"}]}`)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("application/json")
		switch string(ctx.Path()) {
		case "/v1/models":
			ctx.SetBody(models)
		case "/v1/chat/completions":
			ctx.SetBody(answer)
		case "/metrics":
			ctx.SetStatusCode(fasthttp.StatusNotFound)
		}
	}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// TestHandlerAllocationBudget measures the real request path, not a copy of
// it: a chat request through a running kvroute (accept, admit, read the
// body, Router.Prepare, Route, forward, relay the answer, account for it)
// from a fasthttp client in this process to a replica that allocates
// nothing. Its allocations per request stay within a budget that does not
// grow with the conversation.
func TestHandlerAllocationBudget(t *testing.T) {
	up := fastUpstream(t)
	for _, policy := range []string{"round_robin", "cache_aware"} {
		t.Run(policy, func(t *testing.T) {
			k := kvtest.Start(t, nil, func(cfg *config.Config) {
				cfg.Policy = policy
				cfg.Backends = []config.Backend{{Name: "a", URL: up, Engine: "vllm"}, {Name: "b", URL: up, Engine: "vllm"}}
				// No background rounds during the measurement.
				cfg.Health.Interval, cfg.Metrics.Interval = time.Hour, time.Hour
				cfg.Log.Level = "warn"
			})
			c := &fasthttp.HostClient{Addr: k.URL[len("http://"):]}
			for _, turns := range []int{2, 20} {
				body := conversationBody(turns, 1500)
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI(k.URL + "/v1/chat/completions")
				req.Header.SetMethod(fasthttp.MethodPost)
				req.Header.SetContentType("application/json")
				req.SetBody(body)
				do := func() {
					if err := c.Do(req, resp); err != nil || resp.StatusCode() != 200 {
						t.Fatalf("status %d, %v: %s", resp.StatusCode(), err, resp.Body())
					}
				}
				for range 20 {
					do() // warm: connections, pools, tokenizer caches
				}
				allocs := testing.AllocsPerRun(200, do)
				budget := 30.0
				if race.Enabled {
					budget = 80 // -race drops pooled buffers at random
				}
				t.Logf("%s, %d turns (%d bytes): %.1f allocations per request", policy, turns, len(body), allocs)
				if allocs > budget {
					t.Errorf("%d turns: %.1f allocations per request through the handler, budget %.0f", turns, allocs, budget)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		})
	}
}
