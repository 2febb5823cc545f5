package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/server"
)

// fakeReplica is a real HTTP server on 127.0.0.1 standing in for a vLLM
// replica. Its behaviour on the OpenAI paths is set by handler; /health,
// /v1/models and /metrics answer like vLLM unless overridden.
type fakeReplica struct {
	name    string
	srv     *http.Server
	ln      net.Listener
	addr    string
	models  []string
	healthy atomic.Bool
	hits    atomic.Int64
	mu      sync.Mutex
	handler http.HandlerFunc
	last    *http.Request
	body    []byte
}

func newFakeReplica(t *testing.T, name string, h http.HandlerFunc) *fakeReplica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeReplica{name: name, ln: ln, addr: ln.Addr().String(), models: []string{"m1"}, handler: h}
	f.healthy.Store(true)
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	return f
}

func (f *fakeReplica) url() string { return "http://" + f.addr }

func (f *fakeReplica) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !f.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	case "/v1/models":
		var ids []string
		for _, m := range f.models {
			ids = append(ids, fmt.Sprintf(`{"id":%q,"object":"model"}`, m))
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(ids, ","))
		return
	case "/metrics":
		fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=%q} 0\nvllm:num_requests_running{model_name=%q} 0\n", f.models[0], f.models[0])
		return
	}
	f.hits.Add(1)
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.last, f.body = r, body
	h := f.handler
	f.mu.Unlock()
	if h == nil {
		echo(w, r, body)
		return
	}
	h(w, r)
}

func (f *fakeReplica) lastRequest() (*http.Request, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.body
}

// echo answers with a small JSON completion naming the path.
func echo(w http.ResponseWriter, r *http.Request, _ []byte) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"x","object":"chat.completion","path":%q}`, r.URL.Path)
}

// kv is a running kvroute in front of replicas.
type kv struct {
	srv    *server.Server
	url    string
	admin  string
	cancel context.CancelFunc
	done   chan error
}

type cfgOpt func(*config.Config)

func startKV(t *testing.T, reps []*fakeReplica, opts ...cfgOpt) *kv {
	t.Helper()
	cfg := testConfig(reps)
	for _, o := range opts {
		o(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	aln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	k := &kv{srv: srv, url: "http://" + ln.Addr().String(), admin: "http://" + aln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { k.done <- srv.Run(ctx, ln, aln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-k.done:
		case <-time.After(10 * time.Second):
			t.Error("kvroute did not stop")
		}
	})
	srv.Fleet.CheckNow(context.Background())
	return k
}

func testConfig(reps []*fakeReplica) *config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Policy = "round_robin"
	cfg.Limits.MaxBodyBytes, cfg.Limits.MaxConnsPerReplica = 1<<20, 64
	cfg.Timeouts = config.Timeouts{Connect: time.Second, FirstByte: 5 * time.Second, StreamIdle: 5 * time.Second,
		ClientHeader: 5 * time.Second, Drain: 5 * time.Second}
	cfg.Health = config.Health{Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond, FailThreshold: 2}
	cfg.Metrics = config.Metrics{Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond}
	cfg.Tokenizer.CacheBytes = 1 << 20
	cfg.CacheAware.MinMatchTokens = 64
	cfg.CacheAware.TTL = time.Minute
	cfg.CacheAware.DefaultBudgetTokens = 1 << 20
	cfg.CacheAware.TreeMaxBytes = 64 << 20
	cfg.Session.TTL = time.Minute
	for _, r := range reps {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: r.name, URL: r.url(), Engine: "vllm"})
	}
	return cfg
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// deadURL returns a 127.0.0.1 URL where nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hello"}]}`

func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
