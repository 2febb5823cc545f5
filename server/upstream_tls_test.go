package server_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/server"
)

// streamOrEcho answers a request with X-Test-Stream with three events,
// anything else with kvtest.Echo.
func streamOrEcho(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Test-Stream") == "" {
		kvtest.Echo(w, r, nil)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 3 {
		_, _ = fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
		w.(http.Flusher).Flush()
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}

// streamEvents posts a streamed chat request and returns the data lines.
func streamEvents(t *testing.T, url string) (backend string, events []string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Test-Stream", "1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "data: ") {
			events = append(events, l)
		}
	}
	return resp.Header.Get("X-Kvroute-Backend"), events
}

// mutualTLS is a replica's server configuration that requires a client
// certificate signed by ca.
func mutualTLS(ca *kvtest.CA, leaf kvtest.Leaf) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{leaf.TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()}
}

func TestUpstreamTLSEndToEnd(t *testing.T) {
	ca := kvtest.NewCA(t)
	ipLeaf := ca.Server(t, "127.0.0.1")
	nameLeaf := ca.Server(t, "engine.internal")
	client := ca.Client(t, "kvroute")

	// a: mutual TLS under a base path. b: mutual TLS, answering only a
	// hello that names engine.internal (its certificate has no IP).
	a := kvtest.NewUpstream(t, "a", kvtest.UpstreamOptions{TLS: mutualTLS(ca, ipLeaf), BasePath: "/engine-a"}, streamOrEcho)
	bTLS := mutualTLS(ca, nameLeaf)
	bTLS.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if h.ServerName != "engine.internal" {
			return nil, fmt.Errorf("no certificate for server name %q", h.ServerName)
		}
		return nil, nil
	}
	b := kvtest.NewUpstream(t, "b", kvtest.UpstreamOptions{TLS: bTLS}, streamOrEcho)

	k := kvtest.Start(t, nil, func(c *config.Config) {
		c.UpstreamTLS = config.UpstreamTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}
		c.Backends = []config.Backend{
			{Name: "a", URL: a.URL(), Engine: "vllm"},
			{Name: "b", URL: b.URL(), Engine: "vllm", UpstreamTLS: &config.UpstreamTLS{ServerName: "engine.internal"}},
		}
	})
	if !strings.HasPrefix(a.URL(), "https://127.0.0.1:") || !strings.HasSuffix(a.URL(), "/engine-a") {
		t.Fatalf("upstream URL %s", a.URL())
	}

	// Health, models and metrics checks over TLS, under the base path.
	for _, r := range k.Srv.Fleet.Replicas() {
		if !r.Healthy() || r.Snapshot() == nil || len(r.Models()) != 1 {
			t.Fatalf("replica %s: healthy %v, snapshot %v, models %v, last error %q", r.Name(), r.Healthy(), r.Snapshot(), r.Models(), r.LastError())
		}
	}
	for _, p := range []string{"/engine-a/health", "/engine-a/v1/models", "/engine-a/metrics"} {
		if a.PathHits(p) == 0 {
			t.Errorf("a was never asked for %s", p)
		}
	}

	// Proxied requests and streams reach both, a under its base path.
	seen := map[string]int{}
	for range 4 {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions?trace=1", kvtest.ChatBody)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"path":"/v1/chat/completions"`) {
			t.Fatalf("chat over TLS: %d %s", resp.StatusCode, body)
		}
		seen[resp.Header.Get("X-Kvroute-Backend")]++
	}
	if seen["a"] != 2 || seen["b"] != 2 {
		t.Errorf("chat requests went to %v, want 2 each", seen)
	}
	if n := a.PathHits("/engine-a/v1/chat/completions"); n != 2 {
		t.Errorf("a got %d chat requests under its base path, want 2", n)
	}
	if r, _ := a.LastRequest(); r.URL.RawQuery != "trace=1" || r.Host != strings.TrimPrefix(strings.TrimSuffix(a.URL(), "/engine-a"), "https://") {
		t.Errorf("a got query %q, Host %q", r.URL.RawQuery, r.Host)
	}
	want := `data: {"i":0}|data: {"i":1}|data: {"i":2}|data: [DONE]`
	streamed := map[string]bool{}
	for range 2 {
		backend, events := streamEvents(t, k.URL)
		if strings.Join(events, "|") != want {
			t.Errorf("stream from %s: %v", backend, events)
		}
		streamed[backend] = true
	}
	if !streamed["a"] || !streamed["b"] {
		t.Errorf("streams came from %v, want a and b", streamed)
	}
}

func TestUpstreamTLSRefusals(t *testing.T) {
	ca := kvtest.NewCA(t)
	ipLeaf := ca.Server(t, "127.0.0.1")
	nameLeaf := ca.Server(t, "engine.internal")
	client := ca.Client(t, "kvroute")
	sniOnly := &tls.Config{Certificates: []tls.Certificate{nameLeaf.TLS}, GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if h.ServerName != "engine.internal" {
			return nil, fmt.Errorf("no certificate for server name %q", h.ServerName)
		}
		return nil, nil
	}}
	tests := []struct {
		name   string
		server *tls.Config
		global config.UpstreamTLS
		own    *config.UpstreamTLS
	}{
		{name: "mutual TLS without a client certificate", server: mutualTLS(ca, ipLeaf), global: config.UpstreamTLS{CAFile: ca.File}},
		{name: "unknown CA", server: &tls.Config{Certificates: []tls.Certificate{ipLeaf.TLS}}},
		{name: "no server name", server: sniOnly, global: config.UpstreamTLS{CAFile: ca.File}},
		{name: "per-backend override of the client certificate", server: mutualTLS(ca, ipLeaf),
			global: config.UpstreamTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile},
			own:    &config.UpstreamTLS{CertFile: ca.File, KeyFile: client.KeyFile}}, // a certificate that is not the key's
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := kvtest.NewUpstream(t, "a", kvtest.UpstreamOptions{TLS: tt.server}, nil)
			cfg := kvtest.Config(nil)
			cfg.UpstreamTLS = tt.global
			cfg.Backends = []config.Backend{{Name: "a", URL: up.URL(), Engine: "vllm", UpstreamTLS: tt.own}}
			if tt.own != nil {
				// A bad pair is refused at build time, naming the files.
				_, err := server.Build(cfg, zap.NewNop())
				if err == nil || !strings.Contains(err.Error(), ca.File) || !strings.Contains(err.Error(), client.KeyFile) {
					t.Fatalf("build error %v", err)
				}
				return
			}
			k := kvtest.Start(t, nil, func(c *config.Config) { *c = *cfg })
			if r := k.Srv.Fleet.ByName("a"); r.LastError() == "" || r.Snapshot() != nil {
				t.Errorf("checks passed: last error %q, snapshot %v", r.LastError(), r.Snapshot())
			}
			resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody)
			if resp.StatusCode < 500 {
				t.Errorf("chat: %d %s", resp.StatusCode, body)
			}
			if up.Hits.Load() != 0 {
				t.Errorf("the replica served %d requests", up.Hits.Load())
			}
		})
	}
}

func TestUpstreamTLSFileErrors(t *testing.T) {
	ca := kvtest.NewCA(t)
	client := ca.Client(t, "kvroute")
	missing := filepath.Join(t.TempDir(), "nowhere.pem")
	tests := []struct {
		name   string
		global config.UpstreamTLS
		own    *config.UpstreamTLS
	}{
		{name: "global CA", global: config.UpstreamTLS{CAFile: missing}},
		{name: "global cert", global: config.UpstreamTLS{CertFile: missing, KeyFile: client.KeyFile}},
		{name: "backend key", global: config.UpstreamTLS{CAFile: ca.File}, own: &config.UpstreamTLS{CertFile: client.CertFile, KeyFile: missing}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := kvtest.Config(nil)
			cfg.UpstreamTLS = tt.global
			cfg.Backends = []config.Backend{{Name: "a", URL: "https://127.0.0.1:1", Engine: "vllm", UpstreamTLS: tt.own}}
			_, err := server.Build(cfg, zap.NewNop())
			if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), `"a"`) {
				t.Fatalf("error %v, want one naming %s and the backend", err, missing)
			}
		})
	}
}

func TestFirstByteTimeoutOverTLS(t *testing.T) {
	// The replica takes longer than timeouts.stream_idle to start its
	// answer but less than timeouts.first_byte: the TLS records a server
	// sends after the handshake must not count as the first response byte
	// and switch the wait to the idle timeout. A TLS 1.3 server that asks
	// for a client certificate sends its session tickets once it has the
	// client's Finished, so they arrive after the client's handshake is
	// over, while it awaits the response.
	ca := kvtest.NewCA(t)
	leaf := ca.Server(t, "127.0.0.1")
	client := ca.Client(t, "kvroute")
	srvTLS := mutualTLS(ca, leaf)
	srvTLS.MinVersion = tls.VersionTLS13
	up := kvtest.NewUpstream(t, "a", kvtest.UpstreamOptions{TLS: srvTLS},
		func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(time.Second)
			kvtest.Echo(w, r, nil)
		})
	k := kvtest.Start(t, nil, func(c *config.Config) {
		c.UpstreamTLS = config.UpstreamTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}
		c.Backends = []config.Backend{{Name: "a", URL: up.URL(), Engine: "vllm"}}
		c.Timeouts.FirstByte, c.Timeouts.StreamIdle = 10*time.Second, 300*time.Millisecond
	})
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("slow first byte over TLS: %d %s", resp.StatusCode, body)
	}
}

func TestModelsFilledBeforeServing(t *testing.T) {
	// A replica slow to pass its first health check: the first requests,
	// sent as soon as Run is called, still see its models.
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			time.Sleep(300 * time.Millisecond)
		case "/metrics":
			_, _ = io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"slow-m","object":"model","max_model_len":4096}]}`)
		default:
			kvtest.Echo(w, r, nil)
		}
	}))
	t.Cleanup(eng.Close)
	cfg := kvtest.Config(nil)
	cfg.Backends = []config.Backend{{Name: "a", URL: eng.URL, Engine: "vllm"}}
	cfg.Health.Timeout = 5 * time.Second
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
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})

	// Connections wait in the listener's backlog until kvroute serves.
	resp, err := httpGet(t, http.DefaultClient, "http://"+ln.Addr().String()+"/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	var list struct {
		Data []json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Data) != 1 ||
		string(list.Data[0]) != `{"id":"slow-m","object":"model","max_model_len":4096}` {
		t.Fatalf("first model list: %s", body)
	}
	resp2, body2 := postJSON(t, "http://"+ln.Addr().String()+"/v1/completions", `{"model":"nope","prompt":"x"}`)
	if resp2.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model right after start: %d %s", resp2.StatusCode, body2)
	}
}

func TestRetryFromHTTPToHTTPSReplica(t *testing.T) {
	// One upstream request is reused across attempts: a retry from a plain
	// replica that refuses the connection to an https one under a base
	// path must carry the second replica's scheme, host and path.
	ca := kvtest.NewCA(t)
	leaf := ca.Server(t, "127.0.0.1")
	up := kvtest.NewUpstream(t, "tls", kvtest.UpstreamOptions{TLS: &tls.Config{Certificates: []tls.Certificate{leaf.TLS}}, BasePath: "/b"}, nil)
	k := kvtest.Start(t, nil, func(c *config.Config) {
		c.Retries = 1
		c.Health.FailThreshold = 100 // keep the dead replica in rotation
		c.UpstreamTLS.CAFile = ca.File
		c.Backends = []config.Backend{
			{Name: "dead", URL: kvtest.DeadURL(t) + "/a", Engine: "vllm", Models: []string{"m1"}},
			{Name: "tls", URL: up.URL(), Engine: "vllm"},
		}
	})
	for range 4 {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvroute-Backend") != "tls" {
			t.Fatalf("status %d from %q: %s", resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body)
		}
	}
	if n := up.PathHits("/b/v1/chat/completions"); n != 4 {
		t.Errorf("https replica got %d requests under its base path, want 4", n)
	}
}

// A reload that changes no setting still reads the upstream TLS files
// again: a CA bundle rewritten in place (a rotated Secret) takes effect.
func TestReloadRereadsUpstreamTLSFiles(t *testing.T) {
	ca, other := kvtest.NewCA(t), kvtest.NewCA(t)
	up := kvtest.NewUpstream(t, "a", kvtest.UpstreamOptions{TLS: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "127.0.0.1").TLS}}}, nil)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	copyFile(t, other.File, caFile) // the wrong CA first
	cfg := kvtest.Config(nil)
	cfg.UpstreamTLS = config.UpstreamTLS{CAFile: caFile}
	cfg.Backends = []config.Backend{{Name: "a", URL: up.URL(), Engine: "vllm"}}
	k := kvtest.Start(t, nil, func(c *config.Config) { *c = *cfg })
	if resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody); resp.StatusCode < 500 {
		t.Fatalf("with the wrong CA: %d %s", resp.StatusCode, body)
	}
	copyFile(t, ca.File, caFile)
	if err := k.Srv.Reload(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, 10*time.Second, "a request served over the rotated CA", func() bool {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody)
		return resp.StatusCode == http.StatusOK
	})
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
