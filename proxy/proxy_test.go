package proxy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

func TestPassThrough(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a})

	body := `{"model":"m1","messages":[{"role":"user","content":"h\u00e9llo  "}],"extra":{"keep":[1,2,3]}}`
	resp, got := postJSON(t, k.URL+"/v1/chat/completions", body, map[string]string{
		"Authorization":   "Bearer secret-token",
		"Connection":      "X-Hop-Custom",
		"X-Hop-Custom":    "drop me",
		"Keep-Alive":      "timeout=5",
		"X-Forwarded-For": "10.1.2.3",
		"X-Other":         "keep me",
	})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if b := resp.Header.Get("X-Kvroute-Backend"); b != "a" {
		t.Errorf("X-Kvroute-Backend = %q, want a", b)
	}
	r, sent := a.LastRequest()
	if string(sent) != body {
		t.Errorf("body changed in transit:\n got %q\nwant %q", sent, body)
	}
	checks := []struct{ header, want string }{
		{"Authorization", "Bearer secret-token"},
		{"X-Hop-Custom", ""},
		{"Keep-Alive", ""},
		{"X-Forwarded-For", "10.1.2.3, 127.0.0.1"},
		{"X-Other", "keep me"},
	}
	for _, c := range checks {
		if got := r.Header.Get(c.header); got != c.want {
			t.Errorf("upstream %s = %q, want %q", c.header, got, c.want)
		}
	}
}

func TestOtherPathsRoundRobin(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, b})
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodDelete, k.URL+"/custom/path?x=1", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `"/custom/path"`) {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Kvroute-Backend")]++
	}
	if seen["a"] != 3 || seen["b"] != 3 {
		t.Errorf("round robin spread = %v, want 3 each", seen)
	}
	r, _ := a.LastRequest()
	if r.Method != http.MethodDelete || r.URL.RawQuery != "x=1" {
		t.Errorf("forwarded %s ?%s", r.Method, r.URL.RawQuery)
	}
}

func TestModelsUnionAndRouting(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	b.Models = []string{"m2", "lora-x"}
	k := kvtest.Start(t, []*kvtest.Replica{a, b})

	resp, err := httpGet(t, k.URL+"/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	ids := make([]string, 0, len(list.Data))
	for _, d := range list.Data {
		ids = append(ids, d.ID)
	}
	if strings.Join(ids, ",") != "lora-x,m1,m2" {
		t.Errorf("models = %v", ids)
	}
	for i := 0; i < 4; i++ {
		resp, body := postJSON(t, k.URL+"/v1/completions", `{"model":"lora-x","prompt":"hi"}`, nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Backend") != "b" {
			t.Fatalf("lora-x went to %q status %d %s", resp.Header.Get("X-Kvroute-Backend"), resp.StatusCode, body)
		}
	}
	resp2, body := postJSON(t, k.URL+"/v1/completions", `{"model":"nope","prompt":"hi"}`, nil)
	if resp2.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown model: status %d", resp2.StatusCode)
	}
	assertOpenAIError(t, body, "model_not_found")
}

func assertOpenAIError(t *testing.T, body []byte, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %q", body)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("error body lacks message or type: %s", body)
	}
	if code != "" && e.Error.Code != code {
		t.Errorf("error code = %q, want %q (%s)", e.Error.Code, code, body)
	}
}

func TestBadInput(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) { c.Limits.MaxBodyBytes = 4096 })
	cases := []struct {
		name, path, body string
		status           int
	}{
		{"invalid json", "/v1/chat/completions", `{"model":`, 400},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400},
		{"empty body", "/v1/completions", ``, 400},
		{"missing messages", "/v1/chat/completions", `{"model":"m1"}`, 400},
		{"messages not array", "/v1/chat/completions", `{"messages":"hi"}`, 400},
		{"content ill-typed", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400},
		{"role missing", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400},
		{"prompt missing", "/v1/completions", `{"model":"m1"}`, 400},
		{"prompt ill-typed", "/v1/completions", `{"prompt":{"a":1}}`, 400},
		{"prompt mixed list", "/v1/completions", `{"prompt":["a",1]}`, 400},
		{"model ill-typed", "/v1/completions", `{"model":3,"prompt":"x"}`, 400},
		{"stream ill-typed", "/v1/completions", `{"prompt":"x","stream":"yes"}`, 400},
		{"invalid utf8", "/v1/completions", "{\"prompt\":\"\xff\xfe\"}", 400},
		{"embeddings input missing", "/v1/embeddings", `{"model":"m1"}`, 400},
		{"too large", "/v1/completions", `{"prompt":"` + strings.Repeat("x", 5000) + `"}`, 413},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := postJSON(t, k.URL+c.path, c.body, nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			assertOpenAIError(t, body, "")
		})
	}
	if n := a.Hits.Load(); n != 0 {
		t.Errorf("replica saw %d bad requests; none should be forwarded", n)
	}
	mustStillServe(t, k.URL)
}

// sseReplica streams n events, pausing gap between them.
func sseReplica(n int, gap time.Duration, gone chan<- time.Time) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < n; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i); err != nil {
				break
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				if gone != nil {
					gone <- time.Now()
				}
				return
			case <-time.After(gap):
			}
		}
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

func TestStreamingRelaysEventsAsTheyCome(t *testing.T) {
	a := kvtest.NewReplica(t, "a", sseReplica(5, 200*time.Millisecond, nil))
	k := kvtest.Start(t, []*kvtest.Replica{a})
	start := time.Now()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("content type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var times []time.Duration
	var events []string
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, line)
			times = append(times, time.Since(start))
		}
	}
	want := []string{`data: {"i":0}`, `data: {"i":1}`, `data: {"i":2}`, `data: {"i":3}`, `data: {"i":4}`, `data: [DONE]`}
	if strings.Join(events, "|") != strings.Join(want, "|") {
		t.Fatalf("events %v", events)
	}
	// The replica takes about a second in all; the first event must not wait for it.
	if first, last := times[0], times[len(times)-1]; last-first < 600*time.Millisecond {
		t.Errorf("events arrived together (first %v, last %v): not streamed", first, last)
	}
}

func TestClientDisconnectClosesUpstream(t *testing.T) {
	gone := make(chan time.Time, 1)
	a := kvtest.NewReplica(t, "a", sseReplica(1000, 50*time.Millisecond, gone))
	k := kvtest.Start(t, []*kvtest.Replica{a})
	conn := dialTCP(t, strings.TrimPrefix(k.URL, "http://"))
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"i":1`) {
			break
		}
	}
	closed := time.Now()
	_ = conn.Close()
	select {
	case at := <-gone:
		if d := at.Sub(closed); d > time.Second {
			t.Errorf("upstream saw the disconnect after %v, want under 1s", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("upstream never saw the client go away")
	}
	rep := k.Srv.Fleet.ByName("a")
	kvtest.WaitFor(t, 2*time.Second, "in-flight back to zero", func() bool { return rep.InFlight() == 0 })
}

func TestRetryOnRefusedAnd5xx(t *testing.T) {
	good := kvtest.NewReplica(t, "good", nil)
	bad := kvtest.NewReplica(t, "bad", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"error":"boom"}`))
	})
	k := kvtest.Start(t, []*kvtest.Replica{good, bad}, func(c *config.Config) {
		c.Backends = append(c.Backends, config.Backend{Name: "dead", URL: kvtest.DeadURL(t), Engine: "vllm"})
		c.Retries = 2
		c.Health.FailThreshold = 1000 // keep every replica in play: this tests retries, not ejection
		c.Health.Interval = time.Hour
	})
	for i := 0; i < 9; i++ {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Backend") != "good" {
			t.Fatalf("request %d: status %d from %q: %s", i, resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body)
		}
	}
	for _, r := range k.Srv.Fleet.Replicas() {
		if r.InFlight() != 0 {
			t.Errorf("%s in flight %d after retries", r.Name(), r.InFlight())
		}
	}
}

func TestLast5xxIsRelayedWhenNoAttemptsRemain(t *testing.T) {
	bad := kvtest.NewReplica(t, "bad", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"engine overloaded","type":"x","code":"y"}}`))
	})
	k := kvtest.Start(t, []*kvtest.Replica{bad}, func(c *config.Config) { c.Retries = 0 })
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "engine overloaded") {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
}

func TestNoReplicaIs503WithRetryAfter(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	a.Healthy.Store(false)
	k := kvtest.Start(t, []*kvtest.Replica{a})
	rep := k.Srv.Fleet.ByName("a")
	kvtest.WaitFor(t, 3*time.Second, "ejection", func() bool { return !rep.Healthy() })
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	assertOpenAIError(t, body, "no_replica_available")
}

func TestEjectionAndRecovery(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, b})
	rep := k.Srv.Fleet.ByName("b")
	b.Healthy.Store(false)
	kvtest.WaitFor(t, 3*time.Second, "b ejected", func() bool { return !rep.Healthy() })
	for i := 0; i < 4; i++ {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		if resp.Header.Get("X-Kvroute-Backend") != "a" {
			t.Fatalf("request went to ejected replica")
		}
	}
	b.Healthy.Store(true)
	kvtest.WaitFor(t, 3*time.Second, "b back", rep.Healthy)
	seen := map[string]bool{}
	for i := 0; i < 4; i++ {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		seen[resp.Header.Get("X-Kvroute-Backend")] = true
	}
	if !seen["b"] {
		t.Error("recovered replica gets no traffic")
	}
}

func TestPassiveEjectionOfDeadReplica(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) {
		c.Backends = append(c.Backends, config.Backend{Name: "dead", URL: kvtest.DeadURL(t), Engine: "vllm"})
		c.Health.Interval = time.Hour // only passive failures count here
	})
	for i := 0; i < 10; i++ {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d lost: %d %s", i, resp.StatusCode, body)
		}
	}
	if k.Srv.Fleet.ByName("dead").Healthy() {
		t.Error("dead replica not ejected after failed attempts")
	}
}

func TestFirstByteTimeout(t *testing.T) {
	slow := kvtest.NewReplica(t, "slow", func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	k := kvtest.Start(t, []*kvtest.Replica{slow}, func(c *config.Config) {
		c.Timeouts.FirstByte = 300 * time.Millisecond
		c.Retries = 0
	})
	start := time.Now()
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("timeout took %v", d)
	}
	assertOpenAIError(t, body, "replica_timeout")
}

func TestStreamIdleTimeoutEndsWithErrorEvent(t *testing.T) {
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) { c.Timeouts.StreamIdle = 300 * time.Millisecond })
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.Contains(string(body), `"i":0`) || !strings.Contains(string(body), "stream_interrupted") {
		t.Errorf("stream body %q lacks the event or the error event", body)
	}
	rep := k.Srv.Fleet.ByName("a")
	kvtest.WaitFor(t, 2*time.Second, "in-flight zero", func() bool { return rep.InFlight() == 0 })
}

func TestBodylessAnswers(t *testing.T) {
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/empty" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "17")
		if r.Method != http.MethodHead {
			_, _ = w.Write([]byte(`{"head":"answer"}`))
		}
	})
	k := kvtest.Start(t, []*kvtest.Replica{a})
	for _, c := range []struct {
		method, path string
		status       int
	}{{http.MethodHead, "/anything", 200}, {http.MethodGet, "/empty", 204}, {http.MethodHead, "/empty", 204}} {
		req, _ := http.NewRequestWithContext(t.Context(), c.method, k.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", c.method, c.path, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: status %d, want %d", c.method, c.path, resp.StatusCode, c.status)
		}
	}
	if n := k.Srv.Fleet.ByName("a").InFlight(); n != 0 {
		t.Errorf("in flight %d", n)
	}
}

// A non-streamed body of unknown length cut by the replica must not reach
// the client as a complete answer.
func TestChunkedBodyCutIsNotPassedAsComplete(t *testing.T) {
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"text":"partial`))
		w.(http.Flusher).Flush()
		hj, ok := w.(http.Hijacker)
		if !ok {
			return
		}
		conn, _, err := hj.Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	k := kvtest.Start(t, []*kvtest.Replica{a})
	resp, err := httpPost(t, k.URL+"/v1/completions", strings.NewReader(`{"model":"m1","prompt":"x"}`))
	if err != nil {
		return // refused outright: also not a silent truncation
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode == 200 {
		t.Fatalf("truncated body passed as a complete 200: %q", body)
	}
}
