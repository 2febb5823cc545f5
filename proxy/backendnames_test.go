package proxy_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// With expose_backend_names: false no response names a replica, neither in
// X-Kvroute-* headers nor in error bodies, while the access log and the
// metrics still do; a reload turns names back on.
func TestHideBackendNames(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ok := kvtest.NewReplica(t, "gpu-ok-7", nil)
	hang := kvtest.NewReplica(t, "gpu-hang-7", func(http.ResponseWriter, *http.Request) { time.Sleep(time.Second) })
	hang.Models = []string{"m-hang"}
	drop := kvtest.NewReplica(t, "gpu-drop-7", func(w http.ResponseWriter, _ *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	drop.Models = []string{"m-drop"}
	failing := kvtest.NewReplica(t, "gpu-5xx-7", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	failing.Models = []string{"m-5xx"}
	short := kvtest.NewReplica(t, "gpu-short-7", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = w.Write([]byte(`{"partial":`))
	})
	short.Models = []string{"m-short"}
	reps := []*kvtest.Replica{ok, hang, drop, failing, short}
	k := kvtest.StartLogged(t, zap.New(core), reps, func(c *config.Config) {
		c.ExposeBackendNames = false
		c.Retries = 1
		c.Timeouts.FirstByte = 300 * time.Millisecond
		c.Health.FailThreshold = 100
	})
	chat := func(model string) string {
		return `{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`
	}
	cases := []struct {
		model, replica string
		status         int
	}{
		{"m1", "gpu-ok-7", 200},
		{"m-hang", "gpu-hang-7", 504},
		{"m-drop", "gpu-drop-7", 502},
		{"m-5xx", "gpu-5xx-7", 502},
		{"m-short", "gpu-short-7", 502},
	}
	run := func(t *testing.T, exposed bool) {
		for _, c := range cases {
			lines := len(accessLog(logs))
			resp, body := postJSON(t, k.URL+"/v1/chat/completions", chat(c.model), nil)
			if resp.StatusCode != c.status {
				t.Fatalf("%s: status %d, want %d: %s", c.model, resp.StatusCode, c.status, body)
			}
			backend, route := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route")
			named := strings.Contains(string(body), c.replica)
			if exposed {
				if c.status == 200 && (backend != c.replica || route == "") {
					t.Errorf("%s: X-Kvroute-Backend %q X-Kvroute-Route %q with names exposed", c.model, backend, route)
				}
				if c.status != 200 && !named {
					t.Errorf("%s: error body does not name %s with names exposed: %s", c.model, c.replica, body)
				}
			} else {
				if backend != "" || route != "" {
					t.Errorf("%s: X-Kvroute-Backend %q X-Kvroute-Route %q with names hidden", c.model, backend, route)
				}
				if named || strings.Contains(string(body), "gpu-") {
					t.Errorf("%s: error body names a replica: %s", c.model, body)
				}
				if c.status != 200 && !strings.Contains(string(body), "a replica") {
					t.Errorf("%s: error body %s", c.model, body)
				}
			}
			if c.status != 200 {
				assertOpenAIError(t, body, "")
			}
			kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool { return len(accessLog(logs)) > lines })
			if got := accessLog(logs)[lines].ContextMap()["replica"]; got != c.replica {
				t.Errorf("%s: access log names %v, want %s", c.model, got, c.replica)
			}
		}
	}
	t.Run("hidden", func(t *testing.T) { run(t, false) })
	counts := requestCountsBy(t, k.Admin, "backend")
	for _, c := range cases {
		if counts[c.replica] == 0 {
			t.Errorf("kvroute_requests_total has no series for backend %q: %v", c.replica, counts)
		}
	}

	next := *k.Srv.Config()
	next.ExposeBackendNames = true
	if err := k.Srv.Reload(context.Background(), &next); err != nil {
		t.Fatal(err)
	}
	t.Run("exposed after reload", func(t *testing.T) { run(t, true) })
}
