package precise

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/oai"
)

// renderSim starts one sim replica serving model "sim-test" and returns
// its base URL.
func renderSim(tb testing.TB) string {
	tb.Helper()
	f, err := sim.StartFleet(context.Background(), 1, 0, sim.Config{
		Model:        "sim-test",
		NumGPUBlocks: 4000,
		MaxModelLen:  1 << 20,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(f.Close)
	return f.URLs[0]
}

func newTestRenderer(tb testing.TB, o RenderOptions) *Renderer {
	tb.Helper()
	r, err := NewRenderer(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return r
}

// renderChatBody is the body of a chat request of msgs.
func renderChatBody(tb testing.TB, msgs []sim.Message, extra map[string]any) []byte {
	tb.Helper()
	wire := make([]map[string]string, len(msgs))
	for i, m := range msgs {
		wire[i] = map[string]string{"role": m.Role, "content": m.Content}
	}
	in := map[string]any{"model": "sim-test", "messages": wire}
	for k, v := range extra {
		in[k] = v
	}
	b, err := json.Marshal(in)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func renderText(word string, n int) string {
	return strings.Repeat(word+" ", n)
}

// TestRenderSim: chat and completions renders are the tokens the sim
// replica renders the prompts into; a token-id prompt is used as given.
func TestRenderSim(t *testing.T) {
	r := newTestRenderer(t, RenderOptions{URL: renderSim(t) + "/", Timeout: 5 * time.Second})
	ctx := context.Background()
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 50)}, {Role: "user", Content: "hello\n\"there\""}}
	dst := []uint32{7, 7}
	got, err := r.Render(ctx, oai.KindChat, renderChatBody(t, msgs, map[string]any{"stream": true, "max_tokens": 5}), dst)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]uint32{7, 7}, sim.TokenIDs(sim.RenderChat(msgs))...)
	if !slices.Equal(got, want) {
		t.Fatalf("chat render: %d tokens, want %d", len(got), len(want))
	}

	text := renderText("plain", 77)
	got, err = r.Render(ctx, oai.KindCompletion, []byte(`{"model":"sim-test","prompt":`+strconv.Quote(text)+`,"max_tokens":3}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, sim.TokenIDs([]byte(text))) {
		t.Fatalf("completions render: %d tokens, want %d", len(got), len(sim.TokenIDs([]byte(text))))
	}

	before := r.Stats()
	got, err = r.Render(ctx, oai.KindCompletion, []byte(`{"prompt":[5,4294967295,0,9]}`), []uint32{1})
	if err != nil || !slices.Equal(got, []uint32{1, 5, 4294967295, 0, 9}) {
		t.Fatalf("token-id prompt: %v %v", got, err)
	}
	// A batch of token-id prompts is rendered (the engine says what it
	// makes of it), not passed through.
	if _, err = r.Render(ctx, oai.KindCompletion, []byte(`{"prompt":[[5,6],[7]]}`), nil); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	if st.PassThrough != 1 || st.Rendered != before.Rendered+1 || before.Rendered != 2 || st.Fallbacks() != 0 {
		t.Fatalf("stats %+v", st)
	}
	if st.Latency.Count != 4 || st.Latency.P99 <= 0 || st.Latency.Max < st.Latency.P50 {
		t.Fatalf("latency %+v", st.Latency)
	}

	// A request the replica rejects (another model) is an error, not a
	// switch to /tokenize.
	_, err = r.Render(ctx, oai.KindChat, []byte(`{"model":"other","messages":[{"role":"user","content":"x"}]}`), nil)
	if err == nil || errors.Is(err, ErrRenderNotServed) || !strings.Contains(err.Error(), "404") {
		t.Fatalf("other model: %v", err)
	}
	if _, err = r.Render(ctx, oai.KindResponses, []byte(`{"input":"x"}`), nil); !errors.Is(err, ErrRenderUnsupported) {
		t.Fatalf("responses: %v", err)
	}
	if _, err = r.Render(ctx, oai.KindChat, []byte(`{"messages":`), nil); err == nil {
		t.Fatal("bad body rendered")
	}
	if st := r.Stats(); st.FallbackError != 3 || st.RenderNotServed != 0 || st.Tokenized != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestRenderCache: a body rendered before is answered from the cache; a
// conversation's next turn is rendered again and counted as stable when
// the previous turn's tokens are its prefix; the previous turn's entry
// gives way to it.
func TestRenderCache(t *testing.T) {
	var calls atomic.Int64
	simURL := renderSim(t)
	front := renderFront(t, simURL, func(_ http.ResponseWriter, _ *http.Request) bool {
		calls.Add(1)
		return false
	})
	r := newTestRenderer(t, RenderOptions{URL: front, Timeout: 5 * time.Second})
	ctx := context.Background()
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 40)}, {Role: "user", Content: "q1"}}
	body := renderChatBody(t, msgs, nil)
	first, err := r.Render(ctx, oai.KindChat, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.Render(ctx, oai.KindChat, slices.Clone(body), make([]uint32, 0, 4))
	if err != nil || !slices.Equal(again, first) {
		t.Fatalf("repeat: %v", err)
	}
	if st := r.Stats(); st.CacheHits != 1 || st.Rendered != 1 || calls.Load() != 1 || st.CacheEntries != 1 {
		t.Fatalf("repeat: calls %d, stats %+v", calls.Load(), st)
	}
	// The same messages with another field may render differently: not
	// answered from the cache.
	if _, err = r.Render(ctx, oai.KindChat, renderChatBody(t, msgs, map[string]any{"max_tokens": 9}), nil); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.CacheHits != 1 || st.Rendered != 2 || st.CacheEntries != 1 {
		t.Fatalf("other body: %+v", st)
	}

	next := append(slices.Clone(msgs), sim.Message{Role: "assistant", Content: "a1"}, sim.Message{Role: "user", Content: "q2"})
	toks, err := r.Render(ctx, oai.KindChat, renderChatBody(t, next, nil), nil)
	if err != nil || !slices.Equal(toks, sim.TokenIDs(sim.RenderChat(next))) {
		t.Fatalf("next turn: %v", err)
	}
	if st := r.Stats(); st.Stable != 1 || st.Unstable != 0 || st.Rendered != 3 || st.CacheEntries != 1 {
		t.Fatalf("next turn: %+v", st)
	}
	// A tool result appended to the conversation: one message on.
	tool := append(slices.Clone(next), sim.Message{Role: "tool", Content: "42"})
	if _, err = r.Render(ctx, oai.KindChat, renderChatBody(t, tool, nil), nil); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Stable != 2 || st.CacheEntries != 1 || calls.Load() != 4 {
		t.Fatalf("tool turn: calls %d, %+v", calls.Load(), st)
	}
}

// TestRenderUnstable: a renderer whose next-turn tokens do not extend the
// previous turn's is counted unstable, and the tokens returned are still
// the new render's.
func TestRenderUnstable(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1) == 1 {
			_, _ = io.WriteString(w, `{"token_ids":[1,2,3,4,5]}`)
			return
		}
		_, _ = io.WriteString(w, `{"token_ids":[1,2,9,4,5,6,7]}`)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second})
	msgs := make([]sim.Message, 0, 3)
	msgs = append(msgs, sim.Message{Role: "user", Content: "q1"})
	if _, err := r.Render(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil); err != nil {
		t.Fatal(err)
	}
	msgs = append(msgs, sim.Message{Role: "assistant", Content: "a"}, sim.Message{Role: "user", Content: "q2"})
	got, err := r.Render(context.Background(), oai.KindChat, renderChatBody(t, msgs, nil), nil)
	if err != nil || !slices.Equal(got, []uint32{1, 2, 9, 4, 5, 6, 7}) {
		t.Fatalf("%v %v", got, err)
	}
	if st := r.Stats(); st.Unstable != 1 || st.Stable != 0 || st.DivergedTokens != 3 {
		t.Fatalf("%+v", st)
	}
}

// renderFront starts a server in front of the sim at simURL: intercept
// sees every request first and answers it itself by returning true; the
// others are passed on to the sim.
func renderFront(t *testing.T, simURL string, intercept func(http.ResponseWriter, *http.Request) bool) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if intercept(w, req) {
			return
		}
		up, err := http.NewRequestWithContext(req.Context(), req.Method, simURL+req.URL.Path, req.Body) //nolint:gosec // a test front to the test sim
		if err != nil {
			t.Error(err)
			return
		}
		up.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(up) //nolint:gosec // a test front to the test sim
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer func() { _ = resp.Body.Close() }()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestRenderNotServed: a renderer answering 404 to the render paths but
// serving /tokenize is asked /tokenize from then on, with the request's
// messages, tools and template fields; the render endpoint is tried again
// later and used once served.
func TestRenderNotServed(t *testing.T) {
	var served atomic.Bool
	var renderCalls atomic.Int64
	var lastTokenize atomic.Value
	simURL := renderSim(t)
	front := renderFront(t, simURL, func(w http.ResponseWriter, req *http.Request) bool {
		switch {
		case strings.HasSuffix(req.URL.Path, "/render"):
			renderCalls.Add(1)
			if !served.Load() {
				http.Error(w, `{"detail":"Not Found"}`, http.StatusNotFound)
				return true
			}
		case req.URL.Path == "/tokenize":
			b, _ := io.ReadAll(req.Body)
			lastTokenize.Store(string(b))
			req.Body = io.NopCloser(strings.NewReader(string(b)))
		}
		return false
	})
	r := newTestRenderer(t, RenderOptions{URL: front, Timeout: 5 * time.Second, ReprobeEvery: time.Hour, CacheBytes: -1})
	ctx := context.Background()
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 30)}, {Role: "user", Content: "q"}}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}
	body := renderChatBody(t, msgs, map[string]any{"tools": tools, "stream": true, "max_tokens": 7, "chat_template_kwargs": map[string]any{"x": 1}})
	for i := range 2 {
		got, err := r.Render(ctx, oai.KindChat, body, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The sim renders tools first, as compact JSON.
		want := sim.TokenIDs(append([]byte(`<|tools|>[{"function":{"name":"f"},"type":"function"}]`+"\n"), sim.RenderChat(msgs)...))
		if !slices.Equal(got, want) {
			t.Fatalf("call %d: tokenize tokens differ from the sim's render", i)
		}
	}
	var sent map[string]json.RawMessage
	if err := json.Unmarshal([]byte(lastTokenize.Load().(string)), &sent); err != nil {
		t.Fatal(err)
	}
	if string(sent["add_generation_prompt"]) != "true" || string(sent["model"]) != `"sim-test"` ||
		sent["messages"] == nil || sent["tools"] == nil || string(sent["chat_template_kwargs"]) != `{"x":1}` ||
		sent["stream"] != nil || sent["max_tokens"] != nil {
		t.Fatalf("tokenize body %s", lastTokenize.Load())
	}
	text := renderText("p", 10)
	got, err := r.Render(ctx, oai.KindCompletion, []byte(`{"prompt":`+strconv.Quote(text)+`,"add_special_tokens":false,"n":2}`), nil)
	if err != nil || !slices.Equal(got, sim.TokenIDs([]byte(text))) {
		t.Fatalf("completions via tokenize: %v", err)
	}
	if s := lastTokenize.Load().(string); s != `{"prompt":`+strconv.Quote(text)+`,"add_special_tokens":false}` {
		t.Fatalf("tokenize body %s", s)
	}
	// A list of one prompt goes to /tokenize as that prompt.
	got, err = r.Render(ctx, oai.KindCompletion, []byte(`{"prompt":[`+strconv.Quote(text)+`]}`), nil)
	if err != nil || !slices.Equal(got, sim.TokenIDs([]byte(text))) || lastTokenize.Load().(string) != `{"prompt":`+strconv.Quote(text)+`}` {
		t.Fatalf("one-prompt list via tokenize: %v %s", err, lastTokenize.Load())
	}
	st := r.Stats()
	if !st.TokenizeOnly || st.LastSuccess.IsZero() || !st.LastFallback.IsZero() {
		t.Fatalf("tokenize only %v, last success %v, last fallback %v", st.TokenizeOnly, st.LastSuccess, st.LastFallback)
	}
	if renderCalls.Load() != 1 || st.RenderNotServed != 1 || st.Tokenized != 4 || st.Rendered != 0 || st.Fallbacks() != 0 {
		t.Fatalf("render calls %d, stats %+v", renderCalls.Load(), st)
	}

	// The render endpoint comes back: the next due probe uses it.
	served.Store(true)
	r.nextProbe.Store(time.Now().UnixNano())
	if _, err := r.Render(ctx, oai.KindChat, body, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Render(ctx, oai.KindChat, body, nil); err != nil {
		t.Fatal(err)
	}
	st = r.Stats()
	if renderCalls.Load() != 3 || st.RenderProbes != 1 || st.Rendered != 2 || st.Tokenized != 4 || r.tokenizeOnly.Load() {
		t.Fatalf("after probe: render calls %d, stats %+v", renderCalls.Load(), st)
	}
}

// TestRenderNothingServed: neither render nor /tokenize served.
func TestRenderNothingServed(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second})
	for range 2 {
		if _, err := r.Render(context.Background(), oai.KindChat, []byte(`{"messages":[{"role":"user","content":"x"}]}`), nil); !errors.Is(err, ErrRenderNotServed) {
			t.Fatalf("err %v", err)
		}
	}
	if st := r.Stats(); st.FallbackNotServed != 2 || st.RenderNotServed != 1 || st.LastFallback.IsZero() || !st.LastSuccess.IsZero() {
		t.Fatalf("%+v", st)
	}
}

// TestRenderDeadline: a renderer slower than the deadline: the call
// returns ErrRenderTimeout, long before the renderer answers; so does a
// call whose context has ended.
func TestRenderDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
		_, _ = io.WriteString(w, `{"token_ids":[1]}`)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before srv.Close: it waits for handlers
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 30 * time.Millisecond})
	body := []byte(`{"messages":[{"role":"user","content":"x"}]}`)
	start := time.Now()
	got, err := r.Render(context.Background(), oai.KindChat, body, []uint32{3})
	if !errors.Is(err, ErrRenderTimeout) || !slices.Equal(got, []uint32{3}) {
		t.Fatalf("%v %v", got, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %v", d)
	}
	// A context deadline earlier than the Timeout bounds the call too.
	r2 := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err = r2.Render(ctx, oai.KindChat, body, nil); !errors.Is(err, ErrRenderTimeout) {
		t.Fatalf("ctx deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("ctx deadline: returned after %v", d)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if _, err = r2.Render(done, oai.KindChat, body, nil); !errors.Is(err, ErrRenderTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context: %v", err)
	}
	if st := r.Stats(); st.FallbackTimeout != 1 || st.Rendered != 0 {
		t.Fatalf("%+v", st)
	}
	if st := r2.Stats(); st.FallbackTimeout != 2 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderBadAnswers: answers that are not a render's are errors, dst
// is returned as given, nothing is cached.
func TestRenderBadAnswers(t *testing.T) {
	cases := []struct {
		name, answer string
		status       int
	}{
		{"not json", `{"token_ids":[1,2`, 200},
		{"no token_ids", `{"tokens":[1,2]}`, 200},
		{"not an array", `{"token_ids":"1,2"}`, 200},
		{"string id", `{"token_ids":[1,"2"]}`, 200},
		{"negative id", `{"token_ids":[1,-2]}`, 200},
		{"fraction", `{"token_ids":[1,2.5]}`, 200},
		{"too large", `{"token_ids":[4294967296]}`, 200},
		{"empty", `{"token_ids":[]}`, 200},
		{"empty array", `[]`, 200},
		{"server error", `{"error":{"message":"boom"}}`, 500},
		{"bad request", `{"error":{"message":"too long","code":400}}`, 400},
		{"model not found", `{"object":"error","message":"no such model","code":404}`, 404},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.answer)
			}))
			t.Cleanup(srv.Close)
			r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second})
			for range 2 {
				got, err := r.Render(context.Background(), oai.KindChat, []byte(`{"messages":[{"role":"user","content":"x"}]}`), []uint32{8})
				if err == nil || errors.Is(err, ErrRenderNotServed) || errors.Is(err, ErrRenderTimeout) || !slices.Equal(got, []uint32{8}) {
					t.Fatalf("%v %v", got, err)
				}
			}
			if st := r.Stats(); st.FallbackError != 2 || st.CacheHits != 0 || st.CacheEntries != 0 || st.Tokenized != 0 {
				t.Fatalf("%+v", st)
			}
		})
	}
}

func TestRenderURL(t *testing.T) {
	for _, u := range []string{"", "ftp://h", "http://", "http://h/x?y=1", "://x"} {
		if _, err := NewRenderer(RenderOptions{URL: u}); err == nil {
			t.Errorf("url %q accepted", u)
		}
	}
	r, err := NewRenderer(RenderOptions{URL: "https://render.example/pre/"})
	if err != nil {
		t.Fatal(err)
	}
	if r.client.Addr != "render.example:443" || !r.client.IsTLS || r.chatURL != "https://render.example/pre/v1/chat/completions/render" ||
		r.tokenizeURL != "https://render.example/pre/tokenize" || r.Timeout() != DefaultRenderTimeout {
		t.Fatalf("%s %s %s", r.client.Addr, r.chatURL, r.tokenizeURL)
	}
}

// TestRenderCacheBounds: the cache stays within its bytes, least recently
// used out first, and an entry past its TTL answers nothing.
func TestRenderCacheBounds(t *testing.T) {
	c := newRDCache(3*(rdEntryOverhead+40), time.Minute)
	keys := func(i int) *rdKeys { return &rdKeys{conv: uint64(i) + 1, body: uint64(i) * 7} }
	for i := range 3 {
		c.store(keys(i), make([]uint32, 10), nil, 0)
	}
	if hit, _ := c.lookup(keys(0), 1); hit == nil { // 0 is now the newest
		t.Fatal("entry 0 missing")
	}
	c.store(keys(3), make([]uint32, 10), nil, 0)
	if hit, _ := c.lookup(keys(1), 1); hit != nil {
		t.Fatal("least recently used entry kept")
	}
	for _, i := range []int{0, 2, 3} {
		if hit, _ := c.lookup(keys(i), 1); hit == nil {
			t.Fatalf("entry %d missing", i)
		}
	}
	if n, b, ev := c.counts(); n != 3 || b != 3*(rdEntryOverhead+40) || ev != 1 {
		t.Fatalf("counts %d %d %d", n, b, ev)
	}
	c.store(keys(4), make([]uint32, 1000), nil, 0) // larger than the bound: not kept
	if hit, _ := c.lookup(keys(4), 1); hit != nil {
		t.Fatal("oversized entry kept")
	}
	if hit, _ := c.lookup(keys(2), int64(time.Minute)); hit != nil {
		t.Fatal("expired entry answered")
	}
	if n, _, _ := c.counts(); n != 2 {
		t.Fatalf("expired entry kept: %d entries", n)
	}
	// A body hash that differs misses, and the previous turn is found.
	k := &rdKeys{conv: 99, body: 1, prev: [rdPrevDepth]uint64{5, keys(3).conv}}
	if hit, prev := c.lookup(k, 1); hit != nil || prev == nil || prev.conv != keys(3).conv {
		t.Fatalf("prev lookup %v %v", hit, prev)
	}
}

func TestRenderHistogram(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		v := rng.Uint64N(1 << uint(rng.IntN(62)+1))
		b := rdBucket(v)
		top := rdBucketTop(b)
		if top < v || float64(top-v) > float64(v)/8+1 || (b > 0 && rdBucketTop(b-1) >= v) {
			t.Fatalf("value %d: bucket %d top %d", v, b, top)
		}
	}
	var h rdHistogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Microsecond)
	}
	s := h.summary()
	if s.Count != 1000 || s.Max != time.Millisecond || s.P99 < 990*time.Microsecond || s.P99 > time.Millisecond ||
		s.P50 < 500*time.Microsecond || s.P50 > 563*time.Microsecond {
		t.Fatalf("%+v", s)
	}
}

// TestRenderNumbers: the token ids read are the ids strconv reads,
// whatever follows them and wherever the answer ends.
func TestRenderNumbers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	after := []string{"", ",", "]", " ", "x", "\xff", "\xfa0", "/", ":", "0", "99"}
	for range 200000 {
		var v uint64
		switch rng.IntN(3) {
		case 0:
			v = rng.Uint64N(1000)
		case 1:
			v = rng.Uint64N(1 << 32)
		default:
			v = rng.Uint64N(1 << 40)
		}
		digits := strconv.FormatUint(v, 10)
		tail := after[rng.IntN(len(after))]
		b := []byte("[" + digits + tail)
		want := digits + tail
		n := 0
		for n < len(want) && n < 11 && '0' <= want[n] && want[n] <= '9' {
			n++
		}
		wv, _ := strconv.ParseUint(want[:n], 10, 64)
		got, end := rdNumber(b, 1)
		if got != wv || end != 1+n {
			t.Fatalf("%q: %d at %d, want %d at %d", b, got, end, wv, 1+n)
		}
	}
}

// TestRenderAnswerScan: the token ids of the top-level field are read,
// every other value skipped whatever it holds; malformed answers fail.
func TestRenderAnswerScan(t *testing.T) {
	good := []struct {
		answer string
		want   []uint32
	}{
		{` { "a" : "x\"}]\\" , "extra":{"token_ids":[9],"n":[1,{"b":null}]}, "features":null, "token_ids" : [ 0 , 4294967295,7 ] , "z":-1.5e3 } `, []uint32{0, 4294967295, 7}},
		{`[{"token_ids":[1,2]},{"token_ids":[3]}]`, []uint32{1, 2}},
		{`[{"x":true,"token_ids":[5],"y":false}]`, []uint32{5}},
		{"{\"token_ids\":[\n1\r\n,\t2]}", []uint32{1, 2}},
	}
	for _, c := range good {
		got, err := rdAppendTokens([]byte(c.answer), "token_ids", []uint32{42})
		if err != nil || !slices.Equal(got, append([]uint32{42}, c.want...)) {
			t.Errorf("%s: %v %v", c.answer, got, err)
		}
	}
	bad := []string{
		``, `null`, `"x"`, `{`, `{"token_ids":[1]`, `{"token_ids":[1]}x`, `{"token_ids":[1]}{}`,
		`{"token_ids":[1],"token_ids":[2]}`, `{"token_ids":[01]}`, `{"token_ids":[1,]}`, `{"token_ids":[,1]}`,
		`{"token_ids":[1 2]}`, `{"token_ids":[99999999999]}`, `{"token_ids":[1e3]}`, `{"token_ids":{}}`,
		`{"a":tru,"token_ids":[1]}`, `{"a":"x,"token_ids":[1]}`, `{"a":[1,"token_ids":[1]}`, `{"a" "b","token_ids":[1]}`,
		`{"a":"` + "\x01" + `","token_ids":[1]}`, `[{"token_ids":[1]},]`, `[{"token_ids":[1]}`, `[1]`, `[{"token_ids":[1]},{"a":}]`,
		`{"extra":{"token_ids":[1]}}`, `{"token_ids":[1],}`,
		strings.Repeat(`{"a":`, 100) + `1` + strings.Repeat(`}`, 100),
	}
	for _, a := range []string{`{"token_ids":[1],"features":{"mm_hashes":["x"]}}`, `[{"features":[1],"token_ids":[1]}]`} {
		if _, err := rdAppendTokens([]byte(a), "token_ids", nil); !errors.Is(err, ErrRenderUnkeyed) {
			t.Errorf("%s: %v", a, err)
		}
	}
	if got, err := rdAppendTokens([]byte(`[{"cache_salt":"s","token_ids":[1]}]`), "token_ids", nil); err != nil || !slices.Equal(got, []uint32{1}) {
		t.Errorf("salted answer: %v %v", got, err)
	}
	for _, a := range bad {
		got, err := rdAppendTokens([]byte(a), "token_ids", []uint32{42})
		if err == nil || !slices.Equal(got, []uint32{42}) {
			t.Errorf("%q: %v %v", a, got, err)
		}
	}
}

// TestRenderStart: a render begun by Start and waited for gives the
// tokens RenderRequest gives, while the caller parses the body again
// meanwhile; a slow renderer's Wait returns by the deadline.
func TestRenderStart(t *testing.T) {
	r := newTestRenderer(t, RenderOptions{URL: renderSim(t), Timeout: 5 * time.Second})
	msgs := []sim.Message{{Role: "system", Content: renderText("sys", 20)}, {Role: "user", Content: "q"}}
	body := renderChatBody(t, msgs, nil)
	req, err := oai.Parse(oai.KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	p := r.Start(context.Background(), req, body)
	if _, err := oai.Parse(oai.KindChat, body); err != nil { // work meanwhile, reading the same body
		t.Fatal(err)
	}
	got, err := p.Wait([]uint32{1})
	if err != nil || !slices.Equal(got, append([]uint32{1}, sim.TokenIDs(sim.RenderChat(msgs))...)) {
		t.Fatalf("%v %v", got, err)
	}

	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, _ *http.Request) {
		select {
		case <-release:
		case <-time.After(5 * time.Second):
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	slow := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 30 * time.Millisecond})
	start := time.Now()
	got, err = slow.Start(context.Background(), req, body).Wait([]uint32{2})
	if !errors.Is(err, ErrRenderTimeout) || !slices.Equal(got, []uint32{2}) || time.Since(start) > 2*time.Second {
		t.Fatalf("slow: %v %v after %v", got, err, time.Since(start))
	}
}

// TestRenderTLS: an https render URL.
func TestRenderTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/base/v1/chat/completions/render" {
			http.NotFound(w, req)
			return
		}
		_, _ = io.WriteString(w, `{"token_ids":[3,1,4]}`)
	}))
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	r := newTestRenderer(t, RenderOptions{URL: srv.URL + "/base", Timeout: 5 * time.Second, TLSConfig: &tls.Config{RootCAs: roots}})
	got, err := r.Render(context.Background(), oai.KindChat, []byte(`{"messages":[{"role":"user","content":"x"}]}`), nil)
	if err != nil || !slices.Equal(got, []uint32{3, 1, 4}) {
		t.Fatalf("%v %v", got, err)
	}
}

// TestRenderConcurrent: goroutines rendering conversations turn by turn
// through a cache small enough to evict, some repeating turns, all get
// the sim's tokens, and the counters add up.
func TestRenderConcurrent(t *testing.T) {
	r := newTestRenderer(t, RenderOptions{URL: renderSim(t), Timeout: 10 * time.Second, CacheBytes: 10 << 10})
	const workers, turns = 6, 12
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			msgs := []sim.Message{{Role: "system", Content: renderText("sys"+strconv.Itoa(w), 200)}}
			for i := range turns {
				if i > 0 {
					msgs = append(msgs, sim.Message{Role: "assistant", Content: renderText("a", 30)})
				}
				msgs = append(msgs, sim.Message{Role: "user", Content: "q" + strconv.Itoa(i)})
				body := renderChatBody(t, msgs, nil)
				for range 1 + i%2 { // odd turns twice: the second is a cache hit
					got, err := r.Render(context.Background(), oai.KindChat, body, nil)
					if err == nil && !slices.Equal(got, sim.TokenIDs(sim.RenderChat(msgs))) {
						err = errors.New("tokens differ from the sim's")
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	st := r.Stats()
	calls := uint64(workers * (turns + turns/2))
	if st.Rendered+st.CacheHits != calls || st.Latency.Count != calls || st.CacheHits == 0 || st.CacheEvictions == 0 ||
		st.CacheBytes > 10<<10 || st.Stable == 0 || st.Unstable != 0 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderUnkeyed: a request whose blocks the engine keys by more than
// its tokens gets no exact tokens: a chat request with an image is not
// sent, an answer with multimodal features is refused. A salted request
// is rendered, and tokenized, as any other (its exact key starts from its
// salt: see router.Exact).
func TestRenderUnkeyed(t *testing.T) {
	var answer atomic.Value
	answer.Store(`{"token_ids":[1,2],"features":{"mm_hashes":["h"]}}`)
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		if req.URL.Path == "/tokenize" {
			_, _ = io.WriteString(w, `{"count":1,"tokens":[1]}`)
			return
		}
		s := answer.Load().(string)
		if s == "" {
			http.NotFound(w, req)
			return
		}
		_, _ = io.WriteString(w, s)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second})
	ctx := context.Background()
	image := []byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"what is it"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`)
	if _, err := r.Render(ctx, oai.KindChat, image, nil); !errors.Is(err, ErrRenderUnkeyed) || calls.Load() != 0 {
		t.Fatalf("image: %v, %d calls", err, calls.Load())
	}
	text := []byte(`{"messages":[{"role":"user","content":"x"}]}`)
	if _, err := r.Render(ctx, oai.KindChat, text, nil); !errors.Is(err, ErrRenderUnkeyed) {
		t.Fatalf("features: %v", err)
	}
	answer.Store(`{"token_ids":[1,2],"features":null,"cache_salt":"s"}`)
	salted := []byte(`{"messages":[{"role":"user","content":"x"}],"cache_salt":"s"}`)
	if got, err := r.Render(ctx, oai.KindChat, salted, nil); err != nil || !slices.Equal(got, []uint32{1, 2}) {
		t.Fatalf("cache_salt: %v %v", got, err)
	}
	answer.Store("") // render not served: /tokenize
	salted = []byte(`{"messages":[{"role":"user","content":"x"}],"cache_salt":"t"}`)
	if got, err := r.Render(ctx, oai.KindChat, salted, nil); err != nil || !slices.Equal(got, []uint32{1}) {
		t.Fatalf("salted tokenize: %v %v", got, err)
	}
	if got, err := r.Render(ctx, oai.KindChat, text, nil); err != nil || !slices.Equal(got, []uint32{1}) {
		t.Fatalf("tokenize: %v %v", got, err)
	}
	if st := r.Stats(); st.FallbackUnkeyed != 2 || st.Fallbacks() != 2 || st.Tokenized != 2 || st.CacheEntries != 3 {
		t.Fatalf("%+v", st)
	}
}

// TestRenderMaxConns: with one connection, concurrent calls wait for it
// within their deadline and all get their tokens.
func TestRenderMaxConns(t *testing.T) {
	var inflight, most atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m; m = most.Load() {
			if most.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(2 * time.Millisecond)
		_, _ = io.WriteString(w, `{"token_ids":[6]}`)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second, MaxConns: 1, CacheBytes: -1})
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := r.Render(context.Background(), oai.KindChat, []byte(`{"messages":[{"role":"user","content":"x"}]}`), nil)
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if most.Load() != 1 || r.Stats().Rendered != 4 {
		t.Fatalf("%d at once, %+v", most.Load(), r.Stats())
	}
}

// TestRenderReprobe: once the render endpoint answered as not served, one
// call tries it again every ReprobeEvery, the others use /tokenize.
func TestRenderReprobe(t *testing.T) {
	var renders, tokenizes atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/tokenize" {
			tokenizes.Add(1)
			_, _ = io.WriteString(w, `{"count":1,"tokens":[1]}`)
			return
		}
		renders.Add(1)
		http.NotFound(w, req)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 5 * time.Second, ReprobeEvery: 100 * time.Millisecond, CacheBytes: -1})
	call := func() {
		t.Helper()
		if _, err := r.Render(context.Background(), oai.KindChat, []byte(`{"messages":[{"role":"user","content":"x"}]}`), nil); err != nil {
			t.Fatal(err)
		}
	}
	call()
	first := time.Now()
	call()
	if time.Since(first) < 100*time.Millisecond && renders.Load() != 1 {
		t.Fatalf("render tried again before the reprobe: %d", renders.Load())
	}
	time.Sleep(150 * time.Millisecond)
	call()
	call()
	if renders.Load() > 3 || renders.Load() < 2 || tokenizes.Load() != 4 || r.Stats().RenderProbes < 1 {
		t.Fatalf("renders %d, tokenizes %d, %+v", renders.Load(), tokenizes.Load(), r.Stats())
	}
}

func TestRenderStatsFailing(t *testing.T) {
	now := time.Now()
	for _, tt := range []struct {
		name             string
		success, failure time.Duration // before now; 0 for never
		failing          bool
	}{
		{"never called", 0, 0, false},
		{"only successes", time.Second, 0, false},
		{"never succeeded", 0, time.Millisecond, true},
		{"failed just after a recent success", 10 * time.Millisecond, time.Millisecond, false},
		{"failing for longer than FailingAfter", FailingAfter + time.Millisecond, time.Millisecond, true},
		{"succeeded since the failure", time.Millisecond, FailingAfter * 2, false},
	} {
		var s RenderStats
		if tt.success > 0 {
			s.LastSuccess = now.Add(-tt.success)
		}
		if tt.failure > 0 {
			s.LastFallback = now.Add(-tt.failure)
		}
		if got := s.Failing(now); got != tt.failing {
			t.Errorf("%s: Failing %v, want %v", tt.name, got, tt.failing)
		}
	}
}

// TestRenderBehind: once most of the latest renders took longer than the
// timeout, calls wait for none (ErrRenderBehind, counted, no failure of
// the renderer) while their renders run in the background; once those
// come back in time again, calls wait for their renders again.
func TestRenderBehind(t *testing.T) {
	var slow atomic.Bool
	slow.Store(true)
	var inFlight, most atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m; m = most.Load() {
			if most.CompareAndSwap(m, n) {
				break
			}
		}
		if slow.Load() {
			time.Sleep(60 * time.Millisecond)
		}
		_, _ = io.WriteString(w, `{"token_ids":[1,2,3]}`)
	}))
	t.Cleanup(srv.Close)
	r := newTestRenderer(t, RenderOptions{URL: srv.URL, Timeout: 20 * time.Millisecond, CacheBytes: 1 << 20})
	call := 0
	// until renders until a call ends in want, at most 400 calls apart.
	until := func(want error) {
		t.Helper()
		for range 400 {
			call++
			body := []byte(`{"messages":[{"role":"user","content":"question ` + strconv.Itoa(call) + `"}]}`)
			_, err := r.Render(context.Background(), oai.KindChat, body, nil)
			if errors.Is(err, want) || want == nil && err == nil {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("no call ended in %v: %+v", want, r.Stats())
	}
	until(ErrRenderBehind)
	st := r.Stats()
	if st.FallbackBehind == 0 || st.FallbackTimeout < rdBehindMin/2 {
		t.Fatalf("behind after %d timeouts, %d calls that did not wait", st.FallbackTimeout, st.FallbackBehind)
	}
	if st.Fallbacks() != st.FallbackTimeout+st.FallbackBehind {
		t.Fatalf("fallbacks %d, of which %d timeouts and %d behind", st.Fallbacks(), st.FallbackTimeout, st.FallbackBehind)
	}
	// A burst of calls while behind: none waits, and the renderer gets no
	// more than rdBehindMax of their renders at once, not one per call.
	wait.For(t, 5*time.Second, "the renders before to end", func() bool { return len(r.verifying) == 0 && len(r.behind) == 0 })
	most.Store(0)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			body := []byte(`{"messages":[{"role":"user","content":"burst ` + strconv.Itoa(i) + `"}]}`)
			if _, err := r.Render(context.Background(), oai.KindChat, body, nil); !errors.Is(err, ErrRenderBehind) {
				t.Errorf("a call of the burst: %v, want ErrRenderBehind", err)
			}
		})
	}
	wg.Wait()
	wait.For(t, 5*time.Second, "the burst's renders to end", func() bool { return len(r.verifying) == 0 })
	if m := most.Load(); m < 1 || m > rdBehindMax {
		t.Errorf("the renderer had %d of the burst's renders at once, want 1 to %d", m, rdBehindMax)
	}
	slow.Store(false)
	until(nil)
	if st := r.Stats(); st.Late == 0 {
		t.Fatalf("no render of a call that did not wait was kept: %+v", st)
	}
}
