// Package kvtest runs kvroute against fake replicas for tests: real HTTP
// servers on loopback addresses that behave like vLLM where a test does not
// say otherwise.
package kvtest

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
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// Replica is a real HTTP server on 127.0.0.1 standing in for a vLLM
// replica. Its behaviour on the OpenAI paths is set by handler; /health,
// /v1/models and /metrics answer like vLLM unless overridden.
type Replica struct {
	Name    string
	srv     *http.Server
	ln      net.Listener
	addr    string
	Models  []string
	Healthy atomic.Bool
	Hits    atomic.Int64
	// Waiting is the engine queue /metrics reports
	// (vllm:num_requests_waiting).
	Waiting atomic.Int64
	// Running counts the OpenAI-path requests being answered, which
	// /metrics reports as the engine's batch (vllm:num_requests_running).
	Running atomic.Int64
	// ModelLists counts GET /v1/models: kvroute asks for it after each
	// health check that passed, so it also counts those checks' ends.
	ModelLists atomic.Int64
	mu         sync.Mutex
	handler    http.HandlerFunc
	last       *http.Request
	body       []byte
}

// NewReplica starts a fake replica on 127.0.0.1. h answers the OpenAI paths;
// nil echoes a small JSON completion.
func NewReplica(t testing.TB, name string, h http.HandlerFunc) *Replica {
	t.Helper()
	return NewReplicaAt(t, name, "127.0.0.1:0", h)
}

// NewReplicaAt starts a fake replica listening on addr (a loopback address).
func NewReplicaAt(t testing.TB, name, addr string, h http.HandlerFunc) *Replica {
	t.Helper()
	ln := listen(t, addr)
	f := &Replica{Name: name, ln: ln, addr: ln.Addr().String(), Models: []string{"m1"}, handler: h}
	f.Healthy.Store(true)
	f.srv = &http.Server{Handler: http.HandlerFunc(f.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	return f
}

// URL is the replica's base URL.
func (f *Replica) URL() string { return "http://" + f.addr }

func (f *Replica) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		if !f.Healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	case "/v1/models":
		f.ModelLists.Add(1)
		var ids []string
		for _, m := range f.Models {
			ids = append(ids, fmt.Sprintf(`{"id":%q,"object":"model"}`, m))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"object":"list","data":[%s]}`, strings.Join(ids, ","))
		return
	case "/metrics":
		_, _ = fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=%q} %d\nvllm:num_requests_running{model_name=%q} %d\n",
			f.Models[0], f.Waiting.Load(), f.Models[0], f.Running.Load())
		return
	}
	f.Hits.Add(1)
	f.Running.Add(1)
	defer f.Running.Add(-1)
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.last, f.body = r, body
	h := f.handler
	f.mu.Unlock()
	if h == nil {
		Echo(w, r, body)
		return
	}
	h(w, r)
}

// LastRequest returns the last OpenAI-path request and its body.
func (f *Replica) LastRequest() (*http.Request, []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.body
}

// Echo answers with a small JSON completion naming the path.
func Echo(w http.ResponseWriter, r *http.Request, _ []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"id":"x","object":"chat.completion","path":%q}`, r.URL.Path)
}

// KV is a kvroute running in front of fake replicas.
type KV struct {
	Srv      *server.Server
	URL      string
	Admin    string
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// Option changes the test configuration before kvroute starts.
type Option func(*config.Config)

// Start runs kvroute in front of reps on 127.0.0.1 and stops it when the
// test ends.
func Start(t testing.TB, reps []*Replica, opts ...Option) *KV {
	t.Helper()
	return StartLogged(t, zap.NewNop(), reps, opts...)
}

// StartLogged is Start with kvroute logging to log.
func StartLogged(t testing.TB, log *zap.Logger, reps []*Replica, opts ...Option) *KV {
	t.Helper()
	cfg := Config(reps)
	for _, o := range opts {
		o(cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ln := listen(t, "127.0.0.1:0")
	aln := listen(t, "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	k := &KV{Srv: srv, URL: "http://" + ln.Addr().String(), Admin: "http://" + aln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { k.done <- srv.Run(ctx, ln, aln) }()
	t.Cleanup(func() { k.Stop(t) })
	srv.Fleet.CheckNow(context.Background())
	return k
}

// Stop stops kvroute and waits for Run to return; a second call does
// nothing.
func (k *KV) Stop(t testing.TB) {
	t.Helper()
	k.stopOnce.Do(func() {
		k.cancel()
		select {
		case err := <-k.done:
			if err != nil {
				t.Errorf("kvroute: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("kvroute did not stop")
		}
	})
}

// Config is a fast-checking test configuration (round_robin) for reps.
func Config(reps []*Replica) *config.Config {
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Policy = "round_robin"
	cfg.Limits.MaxBodyBytes, cfg.Limits.MaxConnsPerReplica = 1<<20, 64
	// Timeouts not set here keep their defaults.
	tm := &cfg.Timeouts
	tm.Connect, tm.FirstByte, tm.StreamIdle, tm.ClientHeader, tm.Drain = time.Second, 5*time.Second, 5*time.Second, 5*time.Second, 5*time.Second
	tm.DrainDelay = 0
	cfg.Health = config.Health{Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond, FailThreshold: 2}
	cfg.Metrics = config.Metrics{Interval: 100 * time.Millisecond, Timeout: 500 * time.Millisecond}
	cfg.Tokenizer.CacheBytes = 1 << 20
	WithCacheAware(func(c *router.CacheAwareConfig) { c.MinMatchTokens = 64 })(cfg)
	cfg.Index.TTL = time.Minute
	cfg.Index.DefaultBudgetTokens = 1 << 20
	cfg.Index.TreeMaxBytes = 64 << 20
	cfg.Session.TTL = time.Minute
	cfg.ExposeRouteReason = true // tests read why a request went where it did
	for _, r := range reps {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: r.Name, URL: r.URL(), Engine: "vllm"})
	}
	return cfg
}

// WaitFor polls cond until it holds or the deadline passes.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	wait.For(t, d, what, cond)
}

// listen listens on addr (TCP), failing t when it cannot.
func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// DeadURL returns a 127.0.0.1 URL where nothing listens.
func DeadURL(t testing.TB) string {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

// ChatBody is a minimal valid chat request for model m1.
const ChatBody = `{"model":"m1","messages":[{"role":"user","content":"hello"}]}`

// Post sends body to url and returns the response with its body read.
func Post(t testing.TB, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
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
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// WithCacheAware returns a change of a configuration (for Start) that
// applies f to cache_aware's settings, policies.cache_aware.
func WithCacheAware(f func(*router.CacheAwareConfig)) func(*config.Config) {
	return func(cfg *config.Config) {
		if err := config.UpdatePolicy(cfg, router.CacheAwareName, f); err != nil {
			panic(err) // cache_aware's settings are a CacheAwareConfig
		}
	}
}
