package load

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeBody is what the fake server reads from a request.
type fakeBody struct {
	Model         string    `json:"model"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	IgnoreEOS     bool      `json:"ignore_eos"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// fakeServer is an OpenAI-like SSE server on 127.0.0.1. The last user
// message picks a behaviour: "503", "truncate" (no [DONE]), "error" (an
// error event), "nousage"; anything else streams max_tokens tokens.
type fakeServer struct {
	*httptest.Server
	first, token time.Duration // delay before the first token, between tokens

	mu       sync.Mutex
	arrivals map[string][]time.Time // session -> arrival times
	ends     map[string][]time.Time // session -> end times
	inflight atomic.Int32
	maxIn    atomic.Int32
	bodies   atomic.Int32
	bad      atomic.Value // string: a malformed request
	received []string     // each request's messages, as JSON
}

func newFakeServer(t *testing.T, first, token time.Duration) *fakeServer {
	f := &fakeServer{first: first, token: token, arrivals: map[string][]time.Time{}, ends: map[string][]time.Time{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	sess := r.Header.Get("X-Session-ID")
	f.mu.Lock()
	f.arrivals[sess] = append(f.arrivals[sess], time.Now())
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.ends[sess] = append(f.ends[sess], time.Now())
		f.mu.Unlock()
	}()
	var b fakeBody
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		f.bad.Store("path " + r.URL.Path)
	}
	if err := json.NewDecoder(r.Body).Decode(&b); err != nil || !b.Stream || !b.StreamOptions.IncludeUsage || !b.IgnoreEOS || b.Model != "test-model" || len(b.Messages) == 0 {
		f.bad.Store(fmt.Sprintf("body %+v %v", b, err))
	}
	f.bodies.Add(1)
	got, _ := json.Marshal(b.Messages)
	f.mu.Lock()
	f.received = append(f.received, string(got))
	f.mu.Unlock()
	mode := b.Messages[len(b.Messages)-1].Content
	w.Header().Set("X-Kvroute-Backend", "replica-1")
	w.Header().Set("X-Kvroute-Route", "cache_hit matched=32")
	if mode == "503" {
		http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	_, _ = fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
	fl.Flush()
	sleep(r.Context(), f.first)
	for i := 0; i < b.MaxTokens; i++ {
		if i > 0 {
			sleep(r.Context(), f.token)
		}
		if r.Context().Err() != nil {
			return
		}
		_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"}}]}\n\n")
		fl.Flush()
		if mode == "truncate" && i == 1 {
			return
		}
		if mode == "error" && i == 1 {
			_, _ = fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\n")
			return
		}
	}
	if mode != "nousage" {
		_, _ = fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":40}}}\n\n", b.MaxTokens)
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func msgReq(at time.Duration, content string, maxTokens int) Request {
	return Request{At: at, Messages: []Message{{Role: "user", Content: content}}, MaxTokens: maxTokens, PromptTokens: 10, DependsOn: -1}
}

func TestRunMeasures(t *testing.T) {
	f := newFakeServer(t, 30*time.Millisecond, 5*time.Millisecond)
	w := &Workload{Requests: []Request{
		msgReq(0, "hello \"world\"\n", 8),
		msgReq(10*time.Millisecond, "nousage", 5),
		msgReq(20*time.Millisecond, "503", 5),
		msgReq(30*time.Millisecond, "truncate", 5),
		msgReq(40*time.Millisecond, "error", 5),
	}}
	w.Requests[0].Session = "s1"
	var done atomic.Int32
	res, err := Run(context.Background(), f.URL+"/", w, RunOptions{Model: "test-model", OnDone: func(int, Sample) { done.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	if bad := f.bad.Load(); bad != nil {
		t.Fatalf("malformed request: %v", bad)
	}
	if done.Load() != 5 || len(res.Samples) != 5 {
		t.Fatalf("OnDone %d times", done.Load())
	}
	s := res.Samples[0]
	if !s.OK() || s.Status != 200 || s.TTFT < 30*time.Millisecond || s.TTFT >= s.Latency || s.Latency < 65*time.Millisecond {
		t.Fatalf("sample 0: %+v", s)
	}
	if s.OutputTokens != 8 || s.PromptTokens != 100 || s.CachedTokens != 40 || !s.CachedReported || !s.UsageReported ||
		s.Replica != "replica-1" || s.Route != "cache_hit matched=32" {
		t.Fatalf("sample 0: %+v", s)
	}
	if len(f.arrivals["s1"]) != 1 {
		t.Fatal("session header not sent")
	}
	if s := res.Samples[1]; !s.OK() || s.OutputTokens != 5 || s.PromptTokens != 10 || s.UsageReported || s.CachedReported {
		t.Fatalf("sample 1 (no usage): %+v", s)
	}
	if s := res.Samples[2]; s.OK() || s.Status != 503 || s.ErrKind != "http_503" {
		t.Fatalf("sample 2 (503): %+v", s)
	}
	if s := res.Samples[3]; s.OK() || s.Status != 200 || s.ErrKind != ErrStream {
		t.Fatalf("sample 3 (truncated): %+v", s)
	}
	if s := res.Samples[4]; s.OK() || s.ErrKind != ErrStream {
		t.Fatalf("sample 4 (error event): %+v", s)
	}
	sum := res.Summarize(0, 1)
	if sum.Requests != 5 || sum.OK != 2 || sum.Errors != 3 || sum.ErrorsByKind["stream_error"] != 2 || sum.ErrorsByKind["http_503"] != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if sum.CachedReported != 1 || sum.ReportedHitRate != 0.4 {
		t.Fatalf("reported hit rate %v over %d", sum.ReportedHitRate, sum.CachedReported)
	}
}

func TestRunTimeoutAndTransport(t *testing.T) {
	f := newFakeServer(t, 2*time.Second, 0)
	w := &Workload{Requests: []Request{msgReq(0, "slow", 2)}}
	res, err := Run(context.Background(), f.URL, w, RunOptions{Model: "test-model", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Samples[0]; s.ErrKind != ErrTimeout || s.Latency > time.Second {
		t.Fatalf("timeout: %+v", s)
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	res, err = Run(context.Background(), "http://"+addr, w, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Samples[0]; s.ErrKind != ErrTransport || s.Status != 0 || !s.Sent {
		t.Fatalf("transport: %+v", s)
	}
	if _, err := Run(context.Background(), "not a url", w, RunOptions{}); err == nil {
		t.Fatal("bad target accepted")
	}
}

// TestRunOpenLoop checks that arrivals are not delayed by slow responses:
// every request is sent before the first one is answered. (Bounds are loose:
// the test machine may be heavily loaded.)
func TestRunOpenLoop(t *testing.T) {
	f := newFakeServer(t, time.Second, 0)
	var reqs []Request
	for i := 0; i < 10; i++ {
		reqs = append(reqs, msgReq(time.Duration(i)*30*time.Millisecond, "x", 1))
	}
	res, err := Run(context.Background(), f.URL, &Workload{Requests: reqs}, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	firstEnd := res.Samples[0].Start + res.Samples[0].Latency
	for i, s := range res.Samples {
		if !s.OK() || s.Latency < time.Second {
			t.Fatalf("sample %d: %+v", i, s)
		}
		if d := s.Start - reqs[i].At; d < 0 || d > 400*time.Millisecond || s.Lag != d {
			t.Fatalf("request %d sent %v after its arrival (lag %v)", i, d, s.Lag)
		}
		if s.Start >= firstEnd {
			t.Fatalf("request %d sent at %v, after the first answer at %v", i, s.Start, firstEnd)
		}
	}
	if m := f.maxIn.Load(); m != 10 {
		t.Fatalf("only %d requests in flight at once", m)
	}
	if res.Wall < 1270*time.Millisecond || res.Wall > 3*time.Second {
		t.Fatalf("wall %v", res.Wall)
	}
}

func TestRunDependsOn(t *testing.T) {
	f := newFakeServer(t, 100*time.Millisecond, 0)
	think := 50 * time.Millisecond
	reqs := []Request{
		msgReq(0, "a", 1),
		msgReq(0, "b", 1),
		msgReq(20*time.Millisecond, "c", 1),
	}
	reqs[1].DependsOn, reqs[1].Think = 0, think
	reqs[2].DependsOn, reqs[2].Think = 1, think
	for i := range reqs {
		reqs[i].Session = "s"
	}
	res, err := Run(context.Background(), f.URL, &Workload{Requests: reqs, HasSessions: true}, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 3; i++ {
		p, s := res.Samples[i-1], res.Samples[i]
		if !s.OK() || s.Start < p.Start+p.Latency+think || s.Start > p.Start+p.Latency+think+400*time.Millisecond {
			t.Fatalf("turn %d sent at %v, previous ended at %v", i, s.Start, p.Start+p.Latency)
		}
	}
	arr, ends := f.arrivals["s"], f.ends["s"]
	for i := 1; i < 3; i++ {
		if arr[i].Sub(ends[i-1]) < think-5*time.Millisecond {
			t.Fatalf("server saw turn %d %v after turn %d ended", i, arr[i].Sub(ends[i-1]), i-1)
		}
	}
	bad := []Request{msgReq(0, "a", 1)}
	bad[0].DependsOn = 0
	if _, err := Run(context.Background(), f.URL, &Workload{Requests: bad}, RunOptions{}); err == nil {
		t.Fatal("self-dependency accepted")
	}
}

func TestRunMultiTurn(t *testing.T) {
	f := newFakeServer(t, 5*time.Millisecond, time.Millisecond)
	w := MultiTurn(MultiTurnOptions{Users: 4, SystemPrompts: 2, SystemTokens: 64, Turns: 3, Think: 10 * time.Millisecond,
		UserTokens: 8, AnswerTokens: 3, Duration: 50 * time.Millisecond, Seed: 1})
	res, err := Run(context.Background(), f.URL, w, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range res.Samples {
		if !s.OK() || s.OutputTokens != 3 {
			t.Fatalf("sample %d: %+v", i, s)
		}
	}
	for u := 0; u < 4; u++ {
		sess := fmt.Sprintf("user-%d", u)
		arr, ends := f.arrivals[sess], f.ends[sess]
		if len(arr) != 3 {
			t.Fatalf("%s: %d turns", sess, len(arr))
		}
		for k := 1; k < 3; k++ {
			if arr[k].Before(ends[k-1]) {
				t.Fatalf("%s: turn %d before turn %d ended", sess, k, k-1)
			}
		}
	}
}

// With KeepSent the result holds the messages each request was sent with:
// later turns with the answers their conversation received, a Mooncake
// request its synthesized prompt.
func TestRunKeepSent(t *testing.T) {
	f := newFakeServer(t, time.Millisecond, time.Millisecond)
	w := Sequential(SequentialOptions{Conversations: 2, Turns: 3, SystemTokens: 32, UserTokens: 8, AnswerTokens: 2, Seed: 1})
	w.Requests = append(w.Requests, Request{Blocks: []uint64{7, 8}, PromptTokens: 700, MaxTokens: 1, DependsOn: -1, AnswerOf: -1})
	res, err := Run(context.Background(), f.URL, w, RunOptions{Model: "test-model", KeepSent: true})
	if err != nil {
		t.Fatal(err)
	}
	sent := make([]string, 0, len(res.Sent))
	answers := 0
	for i, m := range res.Sent {
		b, _ := json.Marshal(m)
		sent = append(sent, string(b))
		if strings.Contains(string(b), " tok tok") {
			answers++
		}
		if !res.Samples[i].OK() {
			t.Fatalf("request %d: %+v", i, res.Samples[i])
		}
	}
	slices.Sort(sent)
	slices.Sort(f.received)
	if !slices.Equal(sent, f.received) {
		t.Errorf("kept %d message lists unlike the %d received:\n%v\n%v", len(sent), len(f.received), sent, f.received)
	}
	if last := res.Sent[len(res.Sent)-1]; len(last) != 1 || TextTokens(last[0].Content) != 700 {
		t.Errorf("the Mooncake request kept as %d messages", len(last))
	}
	if answers != 4 {
		t.Errorf("%d requests carried the answers received, want the 4 later turns", answers)
	}
}

func TestRunConcurrencyAndCancel(t *testing.T) {
	f := newFakeServer(t, 20*time.Millisecond, 0)
	var reqs []Request
	for i := 0; i < 6; i++ {
		reqs = append(reqs, msgReq(0, "x", 1))
	}
	res, err := Run(context.Background(), f.URL, &Workload{Requests: reqs}, RunOptions{Model: "test-model", Concurrency: 2})
	if err != nil {
		t.Fatal(err)
	}
	if m := f.maxIn.Load(); m > 2 {
		t.Fatalf("%d in flight with a cap of 2", m)
	}
	if sum := res.Summarize(0, 1); sum.OK != 6 {
		t.Fatalf("summary %+v", sum)
	}

	// Cancel mid-run: the in-flight request is canceled, later ones not sent.
	g := newFakeServer(t, time.Second, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	w := &Workload{Requests: []Request{msgReq(0, "x", 1), msgReq(10*time.Second, "y", 1), msgReq(0, "z", 1)}}
	w.Requests[2].DependsOn = 0
	start := time.Now()
	res, err = Run(ctx, g.URL, w, RunOptions{Model: "test-model"})
	if err == nil || time.Since(start) > 2*time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
	if s := res.Samples[0]; s.ErrKind != ErrCanceled || !s.Sent {
		t.Fatalf("sample 0: %+v", s)
	}
	for _, i := range []int{1, 2} {
		if s := res.Samples[i]; s.ErrKind != ErrNotSent || s.Sent {
			t.Fatalf("sample %d: %+v", i, s)
		}
	}
	if sum := res.Summarize(0, 1); sum.Requests != 1 || sum.NotSent != 2 {
		t.Fatalf("summary %+v", sum)
	}
}

func TestRunNonStreamingJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","content":"hi there"}}],"usage":{"prompt_tokens":12,"completion_tokens":2}}`)
	}))
	defer srv.Close()
	res, err := Run(context.Background(), srv.URL, &Workload{Requests: []Request{msgReq(0, "x", 2)}}, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Samples[0]; !s.OK() || s.OutputTokens != 2 || s.PromptTokens != 12 || s.TTFT != s.Latency {
		t.Fatalf("%+v", s)
	}
}

func TestReadSSEEdgeCases(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	in := ": comment\r\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"" + long + "\"}}]}\r\n\r\n" +
		"event: message\n" +
		"data: {\"choices\":[{\"text\":\"x\"}]}\n\n" +
		"data: [DONE]"
	st := stream{t0: time.Now()}
	if err := st.readSSE(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if st.events != 2 || !st.done || st.parseErrors != 0 {
		t.Fatalf("%+v", st)
	}
}
