package router_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/internal/liveheap"
)

// sessionMetrics scrapes kvroute's admin /metrics and returns the session
// table's series by name.
func sessionMetrics(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := map[string]float64{}
	for _, name := range []string{"kvroute_sessions", "kvroute_sessions_max_entries", "kvroute_session_ids_rejected_total", "kvroute_sessions_evicted_total"} {
		f := fams[name]
		if f == nil || len(f.GetMetric()) != 1 {
			t.Fatalf("/metrics lacks %s", name)
		}
		m := f.GetMetric()[0]
		if m.Counter != nil {
			out[name] = m.Counter.GetValue()
		} else {
			out[name] = m.Gauge.GetValue()
		}
	}
	return out
}

// send posts body to kvroute with the given session header (none when
// empty) and returns the replica that answered and the route reason.
func send(t *testing.T, c *http.Client, url string, body []byte, session string) (backend, route string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if session != "" {
		req.Header.Set("X-Session-ID", session)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route")
}

// Large session IDs sent through the proxy, as X-Session-ID headers or as
// the OpenAI user field, leave the heap where it was: before digests, 4,000
// headers of 16 KiB kept 64 MB and 200 user fields of 1 MiB 200 MB. Each
// case runs with the default ID bound (the IDs are rejected) and with one
// raised above them (the IDs are hashed and bound).
func TestSessionHeapThroughProxy(t *testing.T) {
	const bound = 20 << 20
	cases := []struct {
		name       string
		n, size    int
		inUser     bool
		maxIDBytes int
	}{
		{"X-Session-ID 16 KiB, rejected", 4000, 16 << 10, false, 256},
		{"X-Session-ID 16 KiB, hashed", 4000, 16 << 10, false, 32 << 10},
		{"user 1 MiB, rejected", 200, 1 << 20, true, 256},
		{"user 1 MiB, hashed", 200, 1 << 20, true, 2 << 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reps := []*kvtest.Replica{kvtest.NewReplica(t, "a", nil), kvtest.NewReplica(t, "b", nil)}
			k := kvtest.Start(t, reps, func(c *config.Config) {
				c.Policy = "cache_aware"
				c.Limits.MaxBodyBytes = 4 << 20
				c.Limits.MaxHeaderBytes = 64 << 10
				c.Session.MaxIDBytes = tc.maxIDBytes
			})
			c := &http.Client{}
			defer c.CloseIdleConnections()
			// One buffer for every request: the client's own memory stays
			// the same; each request's ID differs in its first bytes.
			id := []byte(strings.Repeat("s", tc.size))
			var body []byte
			idAt := 0
			if tc.inUser {
				prefix := `{"model":"m1","messages":[{"role":"user","content":"hello"}],"user":"`
				body = append(append([]byte(prefix), id...), `"}`...)
				idAt = len(prefix)
			} else {
				body = []byte(kvtest.ChatBody)
			}
			request := func(i int) {
				tag := strconv.Itoa(i) + "-"
				if tc.inUser {
					copy(body[idAt:], tag)
					send(t, c, k.URL, body, "")
					return
				}
				copy(id, tag)
				send(t, c, k.URL, body, string(id))
			}
			// Warm up the buffers of both sides, then measure.
			for i := range 3 {
				request(-1 - i)
			}
			before := liveheap.Bytes()
			for i := range tc.n {
				request(i)
			}
			after := liveheap.Bytes()
			m := sessionMetrics(t, k.Admin)
			wantHeld, wantRejected := float64(tc.n+3), 0.0
			if tc.size > tc.maxIDBytes {
				wantHeld, wantRejected = 0, float64(tc.n+3)
			}
			if m["kvroute_sessions"] != wantHeld || m["kvroute_session_ids_rejected_total"] != wantRejected {
				t.Errorf("sessions %v, rejected %v; want %v, %v", m["kvroute_sessions"], m["kvroute_session_ids_rejected_total"], wantHeld, wantRejected)
			}
			if grew := int64(after) - int64(before); grew > bound {
				t.Errorf("heap grew %d MB for %d session IDs of %d bytes, want < %d MB", grew>>20, tc.n, tc.size, bound>>20)
			} else {
				t.Logf("heap grew %d KB for %d session IDs of %d bytes", grew>>10, tc.n, tc.size)
			}
		})
	}
}

// Normal session IDs keep their replica through the proxy, from the
// header or the user field, under both policies that use sessions.
func TestSessionAffinityThroughProxy(t *testing.T) {
	for _, policy := range []string{"session", "cache_aware"} {
		t.Run(policy, func(t *testing.T) {
			reps := []*kvtest.Replica{kvtest.NewReplica(t, "a", nil), kvtest.NewReplica(t, "b", nil), kvtest.NewReplica(t, "c", nil)}
			k := kvtest.Start(t, reps, func(c *config.Config) { c.Policy = policy })
			c := &http.Client{}
			defer c.CloseIdleConnections()
			for _, user := range []string{"alice", "bob", "carol"} {
				first, _ := send(t, c, k.URL, []byte(kvtest.ChatBody), user)
				for range 4 {
					if got, route := send(t, c, k.URL, []byte(kvtest.ChatBody), user); got != first || route != "session" {
						t.Errorf("header %s: went to %s (%q), first to %s", user, got, route, first)
					}
				}
				body := []byte(`{"model":"m1","messages":[{"role":"user","content":"hello"}],"user":"` + user + `-u"}`)
				first, _ = send(t, c, k.URL, body, "")
				for range 4 {
					if got, route := send(t, c, k.URL, body, ""); got != first || route != "session" {
						t.Errorf("user %s: went to %s (%q), first to %s", user, got, route, first)
					}
				}
			}
			// A session ID over the bound is routed as none.
			long := strings.Repeat("x", 257)
			for range 3 {
				if _, route := send(t, c, k.URL, []byte(kvtest.ChatBody), long); strings.Contains(route, "session") {
					t.Errorf("ID of 257 bytes routed by session (%q)", route)
				}
			}
			m := sessionMetrics(t, k.Admin)
			if m["kvroute_sessions"] != 6 || m["kvroute_session_ids_rejected_total"] != 3 || m["kvroute_sessions_max_entries"] != 100000 {
				t.Errorf("metrics %v, want 6 sessions, 3 rejected, bound 100000", m)
			}
		})
	}
}

// A reload applies new session bounds at once: a lower max_entries drops
// the least recently used bindings, a lower max_id_bytes rejects IDs it
// accepted before.
func TestSessionLimitsReload(t *testing.T) {
	reps := []*kvtest.Replica{kvtest.NewReplica(t, "a", nil), kvtest.NewReplica(t, "b", nil)}
	k := kvtest.Start(t, reps, func(c *config.Config) {
		c.Policy = "session"
		c.Session.MaxEntries = 10
	})
	c := &http.Client{}
	defer c.CloseIdleConnections()
	for i := range 12 {
		send(t, c, k.URL, []byte(kvtest.ChatBody), "user-"+strconv.Itoa(i)+"-"+strings.Repeat("p", 40))
	}
	if m := sessionMetrics(t, k.Admin); m["kvroute_sessions"] != 10 || m["kvroute_sessions_evicted_total"] != 2 {
		t.Fatalf("before reload: %v, want 10 sessions, 2 evicted", m)
	}
	cfg := *k.Srv.Config()
	cfg.Session.MaxEntries, cfg.Session.MaxIDBytes = 3, 32
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := k.Srv.Reload(context.Background(), &cfg); err != nil {
		t.Fatal(err)
	}
	m := sessionMetrics(t, k.Admin)
	if m["kvroute_sessions"] != 3 || m["kvroute_sessions_max_entries"] != 3 || m["kvroute_sessions_evicted_total"] != 9 {
		t.Fatalf("after reload: %v, want 3 sessions, bound 3, 9 evicted", m)
	}
	// user-11 was bound last: still held, but its ID is now over 32 bytes.
	if _, route := send(t, c, k.URL, []byte(kvtest.ChatBody), "user-11-"+strings.Repeat("p", 40)); route == "session" {
		t.Errorf("an ID over the reloaded max_id_bytes was routed by session")
	}
	if m := sessionMetrics(t, k.Admin); m["kvroute_session_ids_rejected_total"] != 1 {
		t.Errorf("rejected %v after reload, want 1", m["kvroute_session_ids_rejected_total"])
	}
}
