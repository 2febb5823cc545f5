package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/server"
)

func TestLoopbackAddr(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:9090", true},
		{"127.0.0.2:9090", true},
		{"[::1]:9090", true},
		{"localhost:9090", true},
		{"LOCALHOST:9090", true},
		{"[::ffff:127.0.0.1]:9090", true},
		{"127.0.0.1", true},
		{"0.0.0.0:9090", false},
		{"[::]:9090", false},
		{":9090", false},
		{"10.0.0.1:9090", false},
		{"[fe80::1%eth0]:9090", false},
		{"kvroute.internal:9090", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := server.LoopbackAddr(tt.addr); got != tt.want {
			t.Errorf("LoopbackAddr(%q) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}

// An admin listener bound off loopback without auth.admin_token serves only
// the probes and /metrics, except to loopback clients.
func TestAdminOffLoopbackNeedsTokenForDebug(t *testing.T) {
	rep := kvtest.NewReplica(t, "a", nil)
	cfg := kvtest.Config([]*kvtest.Replica{rep})
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	exposed := srv.AdminHandler("0.0.0.0:9090")
	local := srv.AdminHandler("127.0.0.1:9090")

	// A real listener on 127.0.0.1 serving the handler as if bound to all
	// addresses: its clients are on loopback, so they get everything.
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: exposed, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	for _, p := range []string{"/debug/backends", "/debug/pprof/", "/metrics", "/healthz"} {
		if got := status(t, "http://"+ln.Addr().String()+p); got != 200 {
			t.Errorf("loopback client, GET %s: status %d, want 200", p, got)
		}
	}

	req := httptest.NewRequestWithContext(t.Context(), "GET", "/readyz", nil)
	req.RemoteAddr = "10.1.2.3:5555"
	w := httptest.NewRecorder()
	exposed.ServeHTTP(w, req)
	if w.Code != 200 && w.Code != 503 {
		t.Errorf("exposed /readyz: status %d, want the probe's answer", w.Code)
	}

	tests := []struct {
		name    string
		handler http.Handler
		method  string
		path    string
		remote  string
		want    int
	}{
		{"exposed healthz", exposed, "GET", "/healthz", "10.1.2.3:5555", 200},
		{"exposed metrics", exposed, "GET", "/metrics", "10.1.2.3:5555", 200},
		{"exposed backends", exposed, "GET", "/debug/backends", "10.1.2.3:5555", 403},
		{"exposed tree", exposed, "GET", "/debug/tree", "10.1.2.3:5555", 403},
		{"exposed route", exposed, "POST", "/debug/route", "10.1.2.3:5555", 403},
		{"exposed pprof", exposed, "GET", "/debug/pprof/", "[2001:db8::1]:5555", 403},
		{"exposed pprof heap", exposed, "GET", "/debug/pprof/heap", "10.1.2.3:5555", 403},
		{"exposed dot path", exposed, "GET", "/metrics/../debug/backends", "10.1.2.3:5555", 403},
		{"exposed unknown", exposed, "GET", "/nothing", "10.1.2.3:5555", 403},
		{"exposed, loopback client", exposed, "GET", "/debug/backends", "127.0.0.1:5555", 200},
		{"exposed, ipv6 loopback client", exposed, "GET", "/debug/backends", "[::1]:5555", 200},
		{"loopback bound", local, "GET", "/debug/backends", "10.1.2.3:5555", 200},
		{"loopback bound pprof", local, "GET", "/debug/pprof/", "10.1.2.3:5555", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequestWithContext(t.Context(), tt.method, tt.path, strings.NewReader(kvtest.ChatBody))
			req.RemoteAddr = tt.remote
			w := httptest.NewRecorder()
			tt.handler.ServeHTTP(w, req)
			if w.Code != tt.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.want, w.Body)
			}
			if tt.want == 403 {
				var body struct {
					Error struct{ Message, Type, Code string }
				}
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
					t.Fatalf("403 body is not JSON: %v: %s", err, w.Body)
				}
				if body.Error.Code != "admin_token_required" || !strings.Contains(body.Error.Message, "auth.admin_token") ||
					!strings.Contains(body.Error.Message, "loopback") {
					t.Errorf("403 body does not explain the fix: %+v", body.Error)
				}
			}
		})
	}

	// With a token, an exposed listener serves /debug/* to those who send it.
	next := *srv.Config()
	next.Auth.AdminToken = "admin-secret"
	srv2, err := server.New(&next, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	tok := srv2.AdminHandler("0.0.0.0:9090")
	for _, tt := range []struct {
		auth string
		want int
	}{{"Bearer admin-secret", 200}, {"", 401}, {"Bearer wrong", 401}} {
		req := httptest.NewRequestWithContext(t.Context(), "GET", "/debug/backends", nil)
		req.RemoteAddr = "10.1.2.3:5555"
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		w := httptest.NewRecorder()
		tok.ServeHTTP(w, req)
		if w.Code != tt.want {
			t.Errorf("token listener, Authorization %q: status %d, want %d", tt.auth, w.Code, tt.want)
		}
	}
}

// A body that does not parse gets the parser's own OpenAI error from
// /debug/route.
func TestDebugRouteParseError(t *testing.T) {
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep})
	resp, err := httpPost(t, http.DefaultClient, k.Admin+"/debug/route", strings.NewReader(`{"messages":`))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	var body struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(b, &body); err != nil || resp.StatusCode != 400 || body.Error.Type != "invalid_request_error" {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}
