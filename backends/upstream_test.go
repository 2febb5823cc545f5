package backends

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testca"

	"github.com/valyala/fasthttp"
)

// testCA is a testca.CA with the shorthands these tests use.
type testCA struct {
	*testca.CA
	file string // the CA's certificate (PEM)
}

func newTestCA(t *testing.T) *testCA {
	ca := testca.New(t)
	return &testCA{CA: ca, file: ca.File}
}

func (ca *testCA) pool() *x509.CertPool { return ca.Pool() }

// issue makes a leaf certificate: a server one for names (IPs or DNS
// names), or a client one; it returns it and its cert and key files.
func (ca *testCA) issue(t *testing.T, client bool, names ...string) (tls.Certificate, string, string) {
	t.Helper()
	var l testca.Leaf
	if client {
		l = ca.Client(t, names[0])
	} else {
		l = ca.Server(t, names...)
	}
	return l.TLS, l.CertFile, l.KeyFile
}

// tlsEngine is an https engine stand-in that serves every path under
// base, records the paths asked and the server names clients sent.
type tlsEngine struct {
	srv   *httptest.Server
	base  string
	mu    sync.Mutex
	paths []string
	snis  []string
}

func startTLSEngine(t *testing.T, cfg *tls.Config, base string) *tlsEngine {
	t.Helper()
	e := &tlsEngine{base: base}
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewUnstartedServer(http.HandlerFunc(e.serve))
	e.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	_ = e.srv.Listener.Close()
	e.srv.Listener = ln
	if cfg != nil {
		cfg = cfg.Clone()
		inner := cfg.GetConfigForClient
		cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			e.mu.Lock()
			e.snis = append(e.snis, h.ServerName)
			e.mu.Unlock()
			if inner != nil {
				return inner(h)
			}
			return nil, nil
		}
		e.srv.TLS = cfg
		e.srv.StartTLS()
	} else {
		e.srv.Start()
	}
	t.Cleanup(e.srv.Close)
	return e
}

// url is the engine's URL as a spec names it: scheme, address, base path.
func (e *tlsEngine) url() string { return e.srv.URL + e.base }

func (e *tlsEngine) serve(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.paths = append(e.paths, r.URL.RequestURI())
	e.mu.Unlock()
	path, ok := strings.CutPrefix(r.URL.Path, e.base)
	if !ok {
		http.NotFound(w, r)
		return
	}
	switch path {
	case "/health":
	case "/metrics":
		_, _ = io.WriteString(w, vllmMinimal)
	case "/v1/models":
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m1","object":"model","max_model_len":4096}]}`)
	default:
		_, _ = fmt.Fprintf(w, `{"path":%q}`, r.URL.RequestURI())
	}
}

func (e *tlsEngine) seen() (paths, snis []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.paths), slices.Clone(e.snis)
}

// proxied sends GET uri through the replica's proxy client as the proxy
// does, and returns the engine's answer.
func proxied(r *Replica, uri string) (int, string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetHost("client-facing.example") // as copied from the client
	r.SetRequestURI(req, []byte(uri))
	if err := r.Client().DoTimeout(req, resp, 5*time.Second); err != nil {
		return 0, "", err
	}
	return resp.StatusCode(), string(resp.Body()), nil
}

func TestUpstreamTLS(t *testing.T) {
	ca := newTestCA(t)
	serverCert, _, _ := ca.issue(t, false, "127.0.0.1")
	sniCert, _, _ := ca.issue(t, false, "engine.internal")
	_, clientCertFile, clientKeyFile := ca.issue(t, true, "kvroute")
	other := newTestCA(t)
	_, otherCertFile, otherKeyFile := other.issue(t, true, "stranger")

	plain := &tls.Config{Certificates: []tls.Certificate{serverCert}}
	mutual := &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.pool()}
	// The SNI engine only answers a hello naming engine.internal.
	sni := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		if h.ServerName != "engine.internal" {
			return nil, fmt.Errorf("unknown server name %q", h.ServerName)
		}
		return &tls.Config{Certificates: []tls.Certificate{sniCert}}, nil
	}}

	tests := []struct {
		name    string
		server  *tls.Config
		spec    TLS
		base    *tls.Config // Options.TLSConfig
		wantErr string      // "" when everything passes, else alternatives a|b of the check error
		wantSNI string
	}{
		{name: "custom CA", server: plain, spec: TLS{CAFile: ca.file}},
		{name: "CA from the base config", server: plain, base: &tls.Config{RootCAs: ca.pool()}},
		{name: "system roots do not know the CA", server: plain, wantErr: "certificate"},
		{name: "insecure skip verify", server: plain, spec: TLS{InsecureSkipVerify: true}},
		{name: "mutual TLS", server: mutual, spec: TLS{CAFile: ca.file, CertFile: clientCertFile, KeyFile: clientKeyFile}},
		// Under TLS 1.3 the server rejects a client certificate after the
		// client's side of the handshake is done: the request then meets a
		// closed connection.
		{name: "mutual TLS without a client certificate", server: mutual, spec: TLS{CAFile: ca.file}, wantErr: "certificate|closed"},
		{name: "mutual TLS with a certificate of another CA", server: mutual,
			spec: TLS{CAFile: ca.file, CertFile: otherCertFile, KeyFile: otherKeyFile}, wantErr: "certificate|closed"},
		{name: "server name", server: sni, spec: TLS{CAFile: ca.file, ServerName: "engine.internal"}, wantSNI: "engine.internal"},
		{name: "server name from the base config", server: sni, spec: TLS{CAFile: ca.file},
			base: &tls.Config{ServerName: "engine.internal"}, wantSNI: "engine.internal"},
		{name: "no server name", server: sni, spec: TLS{CAFile: ca.file}, wantErr: "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startTLSEngine(t, tt.server, "/engine-a")
			f := newTestFleet(t, []Spec{{Name: "a", URL: e.url(), Engine: EngineVLLM, TLS: tt.spec}},
				Options{FailThreshold: 1, TLSConfig: tt.base})
			r := f.ByName("a")
			f.CheckNow(context.Background())
			code, body, err := proxied(r, "/v1/chat/completions?x=1")

			if tt.wantErr != "" {
				if r.Healthy() || !slices.ContainsFunc(strings.Split(tt.wantErr, "|"), func(w string) bool { return strings.Contains(r.LastError(), w) }) {
					t.Errorf("health check passed or failed wrongly: healthy %v, error %q", r.Healthy(), r.LastError())
				}
				if err == nil {
					t.Errorf("proxied request succeeded: %d %s", code, body)
				}
				return
			}
			if !r.Healthy() || r.Snapshot() == nil || !slices.Equal(r.Models(), []string{"m1"}) {
				t.Fatalf("checks over TLS: healthy %v, snapshot %v, models %v, error %q", r.Healthy(), r.Snapshot(), r.Models(), r.LastError())
			}
			if err != nil || code != http.StatusOK || body != `{"path":"/engine-a/v1/chat/completions?x=1"}` {
				t.Fatalf("proxied request over TLS: %v %d %s", err, code, body)
			}
			paths, snis := e.seen()
			for _, p := range []string{"/engine-a/health", "/engine-a/v1/models", "/engine-a/metrics"} {
				if !slices.Contains(paths, p) {
					t.Errorf("engine never asked for %s (asked %v)", p, paths)
				}
			}
			for _, s := range snis {
				if s != tt.wantSNI {
					t.Errorf("client sent server name %q, want %q", s, tt.wantSNI)
				}
			}
			if len(snis) == 0 {
				t.Error("no TLS handshake seen")
			}
		})
	}
}

func TestTLSOptionsApply(t *testing.T) {
	ca := newTestCA(t)
	_, certFile, keyFile := ca.issue(t, true, "kvroute")
	f := newTestFleet(t, []Spec{
		{Name: "a", URL: "https://Engine.Internal:8443/x", Engine: EngineVLLM,
			TLS: TLS{CAFile: ca.file, CertFile: certFile, KeyFile: keyFile, ServerName: "sni.internal", InsecureSkipVerify: true}},
		{Name: "b", URL: "https://engine.internal", Engine: EngineVLLM},
		{Name: "c", URL: "http://engine.internal", Engine: EngineVLLM, TLS: TLS{CAFile: ca.file}},
	}, Options{TLSConfig: &tls.Config{MinVersion: tls.VersionTLS10}})
	a, b := f.ByName("a").tlsConfig(), f.ByName("b").tlsConfig()
	if a.ServerName != "sni.internal" || !a.InsecureSkipVerify || len(a.Certificates) != 1 || a.RootCAs == nil ||
		a.MinVersion != tls.VersionTLS12 || !a.RootCAs.Equal(ca.pool()) {
		t.Errorf("a's TLS config: %+v", a)
	}
	if b.ServerName != "engine.internal" || b.InsecureSkipVerify || len(b.Certificates) != 0 || b.RootCAs != nil || b.MinVersion != tls.VersionTLS12 {
		t.Errorf("b's TLS config: %+v", b)
	}
	if f.ByName("c").tlsConfig() != nil {
		t.Error("an http replica has a TLS config")
	}
}

func TestTLSFileErrors(t *testing.T) {
	ca := newTestCA(t)
	_, certFile, keyFile := ca.issue(t, true, "kvroute")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		tls  TLS
		want []string // all in the error
	}{
		{"missing CA", TLS{CAFile: missing}, []string{"CA file", missing, "no such file"}},
		{"CA not PEM", TLS{CAFile: notPEM}, []string{"CA file", notPEM, "no PEM certificate"}},
		{"missing cert", TLS{CertFile: missing, KeyFile: keyFile}, []string{"cert file", missing, "no such file"}},
		{"missing key", TLS{CertFile: certFile, KeyFile: missing}, []string{"key file", missing, "no such file"}},
		{"bad key", TLS{CertFile: certFile, KeyFile: notPEM}, []string{certFile, notPEM}},
		{"key of another cert", TLS{CertFile: certFile, KeyFile: ca.file}, []string{certFile, ca.file}},
		{"cert without key", TLS{CertFile: certFile}, []string{"both a cert file and a key file", certFile}},
		{"key without cert", TLS{KeyFile: keyFile}, []string{"both a cert file and a key file", keyFile}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, scheme := range []string{"https", "http"} {
				specs := []Spec{{Name: "a", URL: scheme + "://127.0.0.1:1", Engine: EngineVLLM, TLS: tt.tls}}
				err := ValidateSpecs(specs)
				if err == nil {
					t.Fatalf("%s: accepted", scheme)
				}
				for _, w := range tt.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: error %q does not contain %q", scheme, err, w)
					}
				}
				if _, err := NewFleet(specs, Options{}, nil); err == nil {
					t.Errorf("%s: NewFleet accepted", scheme)
				}
			}
		})
	}
}

func TestSetRequestURI(t *testing.T) {
	tests := []struct {
		url, target string
		want        string // the request line target sent
		wantHost    string
	}{
		{"http://127.0.0.1:8000", "/v1/chat/completions", "/v1/chat/completions", "127.0.0.1:8000"},
		{"http://127.0.0.1:8000/", "/v1/models?x=1&y=%2F", "/v1/models?x=1&y=%2F", "127.0.0.1:8000"},
		{"http://127.0.0.1:8000/engine-a", "/v1/completions", "/engine-a/v1/completions", "127.0.0.1:8000"},
		{"http://127.0.0.1:8000/engine-a/", "/v1/completions?stream=1", "/engine-a/v1/completions?stream=1", "127.0.0.1:8000"},
		{"http://127.0.0.1:8000/a%20b/c", "/x", "/a%20b/c/x", "127.0.0.1:8000"},
		{"https://Engine.Internal/base", "/", "/base/", "engine.internal:443"},
		{"https://[::1]:9000", "/p//q/../r", "/p//q/../r", "[::1]:9000"},
		{"http://h:1/b", "http://evil.example/v1/x?q=1", "/b/v1/x?q=1", "h:1"},
		{"http://h:1/b", "http://evil.example", "/b/", "h:1"},
		{"http://h:1", "*", "/*", "h:1"},
	}
	for _, tt := range tests {
		t.Run(tt.url+" "+tt.target, func(t *testing.T) {
			f := newTestFleet(t, []Spec{{Name: "a", URL: tt.url, Engine: EngineVLLM}}, Options{})
			r := f.ByName("a")
			req := fasthttp.AcquireRequest()
			defer fasthttp.ReleaseRequest(req)
			req.Header.SetHost("kvroute.example")
			// Twice, as a retry does after a send rewrote the URI.
			for range 2 {
				r.SetRequestURI(req, []byte(tt.target))
				if r.target.tls != (string(req.URI().Scheme()) == "https") {
					t.Fatalf("scheme %q for %s", req.URI().Scheme(), tt.url)
				}
				req.URI().DisablePathNormalizing = true
				var sb strings.Builder
				if _, err := req.WriteTo(&sb); err != nil {
					t.Fatal(err)
				}
				line, rest, _ := strings.Cut(sb.String(), "\r\n")
				if line != "GET "+tt.want+" HTTP/1.1" {
					t.Errorf("request line %q, want target %q", line, tt.want)
				}
				if !strings.Contains(rest, "Host: "+tt.wantHost+"\r\n") {
					t.Errorf("headers %q, want Host %s", rest, tt.wantHost)
				}
			}
		})
	}
}

func TestSetRequestURIRetargets(t *testing.T) {
	// One request sent to an http replica, then retried on an https one
	// with a base path, as the proxy's retry loop does.
	ca := newTestCA(t)
	cert, _, _ := ca.issue(t, false, "127.0.0.1")
	h := startTLSEngine(t, nil, "")
	s := startTLSEngine(t, &tls.Config{Certificates: []tls.Certificate{cert}}, "/b")
	f := newTestFleet(t, []Spec{
		{Name: "h", URL: h.url(), Engine: EngineVLLM},
		{Name: "s", URL: s.url(), Engine: EngineVLLM, TLS: TLS{CAFile: ca.file}},
	}, Options{})
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	for _, name := range []string{"h", "s", "h"} {
		r := f.ByName(name)
		r.SetRequestURI(req, []byte("/v1/x?y=1"))
		if err := r.Client().DoTimeout(req, resp, 5*time.Second); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := `{"path":"/v1/x?y=1"}`
		if name == "s" {
			want = `{"path":"/b/v1/x?y=1"}`
		}
		if got := string(resp.Body()); got != want {
			t.Errorf("%s answered %s, want %s", name, got, want)
		}
	}
}

// Over TLS, the proxy client's connections get their read deadlines and
// head checks on the established TLS connection, under the strayGuard
// every connection gets, and are kept alive; the checks' connections get
// neither.
func TestTimedConnOverTLS(t *testing.T) {
	ca := newTestCA(t)
	cert, _, _ := ca.issue(t, false, "127.0.0.1")
	e := startTLSEngine(t, &tls.Config{Certificates: []tls.Certificate{cert}}, "")
	var dials atomic.Int64
	f := newTestFleet(t, []Spec{{Name: "a", URL: e.url(), Engine: EngineVLLM, TLS: TLS{CAFile: ca.file}}}, Options{
		FirstByteTimeout: 5 * time.Second, StreamIdleTimeout: 5 * time.Second,
		Dial: func(addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{Timeout: time.Second}).DialContext(context.Background(), "tcp4", addr)
		},
	})
	r := f.ByName("a")
	f.CheckNow(context.Background())
	if !r.Healthy() {
		t.Fatalf("checks: %s", r.LastError())
	}
	for range 2 {
		if code, body, err := proxied(r, "/v1/x"); err != nil || code != http.StatusOK {
			t.Fatalf("proxied: %v %d %s", err, code, body)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d proxied connections dialled, want 1 (kept alive)", n)
	}
	// guarded unwraps a connection as dialled down to its strayGuard.
	guarded := func(c net.Conn) (g *strayGuard, timed bool) {
		t.Helper()
		w, ok := c.(wrappedTLS)
		if !ok {
			t.Fatalf("dialled a %T, want the TLS wrapper", c)
		}
		inner := w.Conn
		if tc, ok := inner.(*timedConn); ok {
			inner, timed = tc.Conn, true
		}
		if g, ok = inner.(*strayGuard); !ok {
			t.Fatalf("dialled a wrapped %T, want a *strayGuard", inner)
		}
		if _, ok := g.Conn.(*tls.Conn); !ok {
			t.Fatalf("guarded a %T, want the established *tls.Conn", g.Conn)
		}
		t.Cleanup(func() { _ = c.Close() })
		return g, timed
	}
	pc, err := r.client.DialTimeout(r.client.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if g, timed := guarded(pc); !timed || !g.fr.checkHeads {
		t.Fatalf("proxied connection: read deadlines %v, head checks %v; want both", timed, g.fr.checkHeads)
	}
	cc, err := r.checks.DialTimeout(r.checks.Addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if g, timed := guarded(cc); timed || g.fr.checkHeads {
		t.Fatalf("check connection: read deadlines %v, head checks %v; want neither", timed, g.fr.checkHeads)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d connections through Options.Dial, want 2: the checks' never", n)
	}
}

func TestStartWaitsForFirstModels(t *testing.T) {
	slow := newFakeReplica(t, vllmMinimal)
	slow.healthDelay.Store(int64(200 * time.Millisecond))
	slow.setModels(`{"object":"list","data":[{"id":"m-slow","object":"model","max_model_len":8192}]}`)
	dead := closedURL(t)
	f := newTestFleet(t, []Spec{
		{Name: "slow", URL: slow.url(), Engine: EngineVLLM},
		{Name: "dead", URL: dead, Engine: EngineVLLM},
	}, Options{HealthTimeout: 3 * time.Second, HealthInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	if got := f.Models(); !slices.Equal(got, []string{"m-slow"}) {
		t.Fatalf("models right after Start: %v", got)
	}
	if m, ok := f.Model("m-slow"); !ok || string(m.JSON) != `{"id":"m-slow","object":"model","max_model_len":8192}` {
		t.Fatalf("model right after Start: %v %s", ok, m.JSON)
	}
}

func TestStartWaitIsBounded(t *testing.T) {
	// A replica whose /health never answers within the timeout: Start
	// returns once the bound is reached, and cancelling ctx ends the wait.
	hang := newFakeReplica(t, vllmMinimal)
	hang.healthDelay.Store(int64(time.Hour))
	f := newTestFleet(t, []Spec{{Name: "a", URL: hang.url(), Engine: EngineVLLM}},
		Options{HealthTimeout: 100 * time.Millisecond, HealthInterval: time.Hour})
	done := make(chan struct{})
	go func() {
		f.Start(context.Background())
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Start did not return")
	}

	g := newTestFleet(t, []Spec{{Name: "a", URL: hang.url(), Engine: EngineVLLM}},
		Options{HealthTimeout: time.Hour, HealthInterval: time.Hour})
	// Registered after the fleets, so it runs before their cleanups: their
	// loops wait for the hour-long check, which this ends (even one whose
	// connection is made only now).
	t.Cleanup(hang.release)
	ctx, cancel := context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() {
		g.Start(ctx)
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Start ignored its context")
	}
}

func TestModelObjects(t *testing.T) {
	a := newFakeReplica(t, vllmMinimal)
	a.setModels(`{"object":"list","data":[
		{"id":"base","object":"model","created":1700000000,"owned_by":"vllm","root":"/models/base","parent":null,"max_model_len":32768,"permission":[{"id":"p1","allow_view":true}]},
		{"id":"lora-a","object":"model","created":1700000001,"owned_by":"vllm","root":"/adapters/a","parent":"base","max_model_len":32768},
		"not an object", {"object":"model"}]}`)
	b := newFakeReplica(t, vllmMinimal)
	b.setModels(`{"object":"list","data":[{"id":"base","object":"model","owned_by":"b","max_model_len":1},{"id":"only-b","object":"model","x_extra":{"k":[1,2.50,"\u00e9"]}}]}`)
	f := newTestFleet(t, []Spec{
		{Name: "a", URL: a.url(), Engine: EngineVLLM},
		{Name: "b", URL: b.url(), Engine: EngineVLLM},
		{Name: "s", URL: closedURL(t), Engine: EngineVLLM, Models: []string{"static-m", "base"}},
	}, Options{})
	f.CheckNow(context.Background())

	want := map[string]string{
		"base":     `{"id":"base","object":"model","created":1700000000,"owned_by":"vllm","root":"/models/base","parent":null,"max_model_len":32768,"permission":[{"id":"p1","allow_view":true}]}`,
		"lora-a":   `{"id":"lora-a","object":"model","created":1700000001,"owned_by":"vllm","root":"/adapters/a","parent":"base","max_model_len":32768}`,
		"only-b":   `{"id":"only-b","object":"model","x_extra":{"k":[1,2.50,"\u00e9"]}}`,
		"static-m": ``,
	}
	list := f.ModelList()
	ids := make([]string, 0, len(list))
	for _, m := range list {
		ids = append(ids, m.ID)
		if w := want[m.ID]; w != "" && string(m.JSON) != w {
			t.Errorf("%s:\n got %s\nwant %s", m.ID, m.JSON, w)
		}
		got, ok := f.Model(m.ID)
		if !ok || string(got.JSON) != string(m.JSON) {
			t.Errorf("Model(%q) = %v %s, want the list's object", m.ID, ok, got.JSON)
		}
	}
	if !slices.Equal(ids, []string{"base", "lora-a", "only-b", "static-m"}) {
		t.Errorf("ids %v", ids)
	}
	st, _ := f.Model("static-m")
	var obj map[string]any
	if err := json.Unmarshal(st.JSON, &obj); err != nil || obj["id"] != "static-m" || obj["object"] != "model" ||
		obj["owned_by"] != "kvroute" || obj["created"].(float64) <= 0 {
		t.Errorf("static model object %s (%v)", st.JSON, err)
	}
	if _, ok := f.Model("nope"); ok {
		t.Error("Model found an id no replica lists")
	}

	// A changed field alone is picked up; a static list keeps its objects
	// across an Update that does not change it.
	b.setModels(`{"object":"list","data":[{"id":"base","object":"model","owned_by":"b","max_model_len":2},{"id":"only-b","object":"model","max_model_len":7}]}`)
	f.CheckNow(context.Background())
	if m, _ := f.Model("only-b"); string(m.JSON) != `{"id":"only-b","object":"model","max_model_len":7}` {
		t.Errorf("only-b after a field changed: %s", m.JSON)
	}
	specs := make([]Spec, 0, len(f.Replicas()))
	for _, r := range f.Replicas() {
		specs = append(specs, r.Spec())
	}
	if _, _, err := f.Update(specs); err != nil {
		t.Fatal(err)
	}
	if again, _ := f.Model("static-m"); string(again.JSON) != string(st.JSON) {
		t.Errorf("static object changed on reload: %s -> %s", st.JSON, again.JSON)
	}
}

func TestUpdateAppliesTLSChanges(t *testing.T) {
	// A reload keeps the replica and its state; changed TLS settings, or
	// files rewritten in place (a rotated client certificate), apply to
	// the connections made afterwards.
	ca := newTestCA(t)
	serverCert, _, _ := ca.issue(t, false, "127.0.0.1")
	_, certFile, keyFile := ca.issue(t, true, "kvroute")
	var mu sync.Mutex
	var presented []string // the client certificates' names, per handshake
	e := startTLSEngine(t, &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: ca.pool(), VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			mu.Lock()
			defer mu.Unlock()
			presented = append(presented, chains[0][0].Subject.CommonName)
			return nil
		}}, "")
	spec := Spec{Name: "a", URL: e.url(), Engine: EngineVLLM, TLS: TLS{CAFile: ca.file, CertFile: certFile, KeyFile: keyFile}}
	f := newTestFleet(t, []Spec{spec}, Options{})
	a := f.ByName("a")
	send := func() {
		t.Helper()
		if code, body, err := proxied(a, "/v1/x"); err != nil || code != http.StatusOK {
			t.Fatalf("proxied: %v %d %s", err, code, body)
		}
	}
	send()
	cfg := a.tlsConfig()

	// Same settings, same files: the configuration stays, and so does the
	// connection.
	if _, removed, err := f.Update([]Spec{spec}); err != nil || len(removed) != 0 || f.ByName("a") != a || a.tlsConfig() != cfg {
		t.Fatalf("unchanged TLS: removed %d, err %v, config replaced %v", len(removed), err, a.tlsConfig() != cfg)
	}
	send()

	// The client certificate rewritten in place, as a rotation does.
	_, newCert, newKey := ca.issue(t, true, "kvroute-rotated")
	for _, c := range [][2]string{{newCert, certFile}, {newKey, keyFile}} {
		b, err := os.ReadFile(c[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(c[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, removed, err := f.Update([]Spec{spec}); err != nil || len(removed) != 0 || f.ByName("a") != a || a.tlsConfig() == cfg {
		t.Fatalf("rotated files: removed %d, err %v, config replaced %v", len(removed), err, a.tlsConfig() != cfg)
	}
	send()
	mu.Lock()
	if got := strings.Join(presented, ","); got != "kvroute,kvroute-rotated" {
		t.Errorf("client certificates presented: %s", got)
	}
	mu.Unlock()

	spec.TLS.ServerName = "engine.internal"
	if _, _, err := f.Update([]Spec{spec}); err != nil || f.ByName("a") != a || a.tlsConfig().ServerName != "engine.internal" {
		t.Fatalf("changed server name: err %v, name %q", err, a.tlsConfig().ServerName)
	}
	b := f.ByName("a")
	spec.URL = e.url() + "/y"
	if _, removed, err := f.Update([]Spec{spec}); err != nil || len(removed) != 1 || f.ByName("a") == b {
		t.Fatalf("changed base path: removed %d, err %v", len(removed), err)
	}
}

func TestExpandKeepsBasePathAndServerName(t *testing.T) {
	specs := []Spec{
		{Name: "d", URL: "https://engine.svc:8443/engine-a", Engine: EngineVLLM, Discover: true},
		{Name: "n", URL: "https://engine.svc/b", Engine: EngineVLLM, Discover: true, TLS: TLS{ServerName: "set.internal"}},
	}
	out, err := Expand(context.Background(), specs, fakeResolver{"engine.svc": {"10.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].URL != "https://10.0.0.1:8443/engine-a" || out[0].TLS.ServerName != "engine.svc" ||
		out[1].URL != "https://10.0.0.1/b" || out[1].TLS.ServerName != "set.internal" {
		t.Fatalf("expanded %+v", out)
	}
}
