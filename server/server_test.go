package server_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/server"
)

func TestReloadAddsAndRemovesUnderLoad(t *testing.T) {
	slow := func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(20 * time.Millisecond)
		kvtest.Echo(w, r, nil)
	}
	a := kvtest.NewReplica(t, "a", slow)
	b := kvtest.NewReplica(t, "b", slow)
	c := kvtest.NewReplica(t, "c", slow)
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(cfg *config.Config) { cfg.Policy = "cache_aware" })

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"worker %d request %d"}]}`, w, i)
				resp, err := httpPost(t, http.DefaultClient, k.URL+"/v1/chat/completions", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
				}
			}
		}(w)
	}
	time.Sleep(300 * time.Millisecond)
	next := *k.Srv.Config()
	next.Backends = []config.Backend{{Name: "a", URL: a.URL(), Engine: "vllm"}, {Name: "c", URL: c.URL(), Engine: "vllm"}}
	next.Retries = 2
	if err := k.Srv.Reload(context.Background(), &next); err != nil {
		t.Fatal(err)
	}
	bHits := b.Hits.Load()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests failed across the reload", failed.Load(), sent.Load())
	}
	if c.Hits.Load() == 0 {
		t.Error("added replica got no traffic")
	}
	// b may finish what it had in flight at the reload, nothing more.
	if extra := b.Hits.Load() - bHits; extra > 8 {
		t.Errorf("removed replica got %d requests after the reload", extra)
	}
	if k.Srv.Fleet.ByName("b") != nil || k.Srv.Fleet.ByName("a") == nil {
		t.Error("fleet not updated")
	}
	if k.Srv.Config().Retries != 2 {
		t.Error("settings not applied")
	}
}

func TestReloadKeepsStateOfStayingReplicas(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
	prompt := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("alpha beta gamma ", 200) + `"}]}`
	resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt)
	holder := resp.Header.Get("X-Kvroute-Backend")
	before := k.Srv.Fleet.ByName(holder)
	next := *k.Srv.Config()
	next.Retries = 3 // a setting change; the replica list is the same
	if err := k.Srv.Reload(context.Background(), &next); err != nil {
		t.Fatal(err)
	}
	if k.Srv.Fleet.ByName(holder) != before {
		t.Fatal("staying replica was rebuilt")
	}
	resp, _ = postJSON(t, k.URL+"/v1/chat/completions", prompt)
	if got := resp.Header.Get("X-Kvroute-Backend"); got != holder || !strings.HasPrefix(resp.Header.Get("X-Kvroute-Route"), "cache_hit") {
		t.Errorf("tree entries lost across reload: went to %s (%s)", got, resp.Header.Get("X-Kvroute-Route"))
	}
}

// A reload that changes cache_aware.block_size rebuilds the policy, whose
// tree must keep counting the tokenizer's key blocks (fixed until a
// restart): matches are never overstated.
func TestReloadKeepsKeyBlock(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
	prompt := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("alpha beta gamma ", 200) + `"}]}`
	matched := func() int {
		t.Helper()
		postJSON(t, k.URL+"/v1/chat/completions", prompt) // records
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt)
		route := resp.Header.Get("X-Kvroute-Route")
		n, err := strconv.Atoi(strings.TrimPrefix(route, "cache_hit matched="))
		if err != nil {
			t.Fatalf("route %q: %v", route, err)
		}
		return n
	}
	before := matched()
	next := *k.Srv.Config()
	next.Index.BlockSize = 2 * next.Index.BlockSize
	if err := k.Srv.Reload(context.Background(), &next); err != nil {
		t.Fatal(err)
	}
	// The engines' block is now 32 tokens: the match rounds down to it.
	if after := matched(); after > before || after < before-32 {
		t.Fatalf("matched %d tokens before the reload, %d after", before, after)
	}
}

func TestShutdownDrainsStreamInFlight(t *testing.T) {
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 10; i++ {
			_, _ = fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	})
	cfg := kvtest.Config([]*kvtest.Replica{a})
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln, nil) }()
	srv.Fleet.CheckNow(context.Background())

	resp, err := httpPost(t, http.DefaultClient, "http://"+ln.Addr().String()+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel() // SIGTERM: stop accepting, drain
	rest, err := io.ReadAll(br)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("stream cut during drain: %v", err)
	}
	if !strings.Contains(string(rest), `"i":9`) || !strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("stream incomplete after shutdown began: %q", rest)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run returned %v, want nil (exit 0)", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after draining")
	}
	if _, err := dialTCP(t, ln.Addr().String(), time.Second); err == nil {
		t.Error("still accepting connections after shutdown")
	}
}

// testResolver is a resolver under the test's control, of one host.
type testResolver struct {
	host  string
	mu    sync.Mutex
	addrs []string // nil: no such host
}

// set makes host resolve to addrs; with none, host is unknown.
func (r *testResolver) set(addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.addrs = addrs
}

func (r *testResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if host == r.host && r.addrs != nil {
		return append([]string(nil), r.addrs...), nil
	}
	return nil, errors.New("no such host")
}

func TestDiscoveryFollowsTheResolver(t *testing.T) {
	first := kvtest.NewReplicaAt(t, "x", "127.0.0.2:0", nil)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(first.URL(), "http://"))
	second := kvtest.NewReplicaAt(t, "y", "127.0.0.3:"+port, nil)

	res := &testResolver{host: "vllm.test.svc"}
	res.set("127.0.0.2")
	cfg := kvtest.Config(nil)
	cfg.Backends = []config.Backend{{Name: "vllm", URL: "http://vllm.test.svc:" + port, Engine: "vllm", Discover: true}}
	cfg.Discovery.Interval = 50 * time.Millisecond
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	srv.Resolver = res
	ln, _ := listenLocal(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kvroute: %v", err)
		}
	}()

	names := func() string {
		reps := srv.Fleet.Replicas()
		n := make([]string, 0, len(reps))
		for _, r := range reps {
			n = append(n, r.Name())
		}
		return strings.Join(n, ",")
	}
	kvtest.WaitFor(t, 3*time.Second, "first address", func() bool { return names() == "vllm-127.0.0.2" })
	res.set("127.0.0.2", "127.0.0.3")
	kvtest.WaitFor(t, 3*time.Second, "second address", func() bool { return names() == "vllm-127.0.0.2,vllm-127.0.0.3" })
	seen := map[string]bool{}
	for i := 0; i < 6; i++ {
		resp, _ := postJSON(t, "http://"+ln.Addr().String()+"/v1/chat/completions", kvtest.ChatBody)
		seen[resp.Header.Get("X-Kvroute-Backend")] = resp.StatusCode == 200
	}
	if !seen["vllm-127.0.0.2"] || !seen["vllm-127.0.0.3"] {
		t.Errorf("traffic did not reach both discovered replicas: %v", seen)
	}
	res.set("127.0.0.3")
	kvtest.WaitFor(t, 3*time.Second, "address removed", func() bool { return names() == "vllm-127.0.0.3" })
	// A failed lookup keeps the last known replicas.
	res.set()
	time.Sleep(200 * time.Millisecond)
	if names() != "vllm-127.0.0.3" {
		t.Errorf("failed lookup changed the fleet to %q", names())
	}
	_ = second
}

// Replicas found by discovery are in the fleet, with their models, before
// kvroute serves its first request.
func TestDiscoveredModelsFilledBeforeServing(t *testing.T) {
	rep := kvtest.NewReplica(t, "x", nil)
	rep.Models = []string{"found-m"}
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(rep.URL(), "http://"))
	res := &testResolver{host: "vllm.test.svc"}
	res.set("127.0.0.1")
	cfg := kvtest.Config(nil)
	cfg.Backends = []config.Backend{{Name: "vllm", URL: "http://vllm.test.svc:" + port, Engine: "vllm", Discover: true}}
	cfg.Discovery.Interval = time.Hour // only the first round
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	srv.Resolver = res
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kvroute: %v", err)
		}
	}()
	// The connection waits in the listener's backlog until kvroute serves.
	resp, body := postJSON(t, "http://"+ln.Addr().String()+"/v1/chat/completions",
		`{"model":"found-m","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvroute-Backend") != "vllm-127.0.0.1" {
		t.Errorf("first request: %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body)
	}
}
