package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// scrape reads and parses the admin /metrics.
func scrape(t *testing.T, admin string) map[string][]sample {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("admin /metrics does not parse: %v", err)
	}
	out := map[string][]sample{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			s := sample{labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Counter != nil:
				s.value = m.Counter.GetValue()
			case m.Gauge != nil:
				s.value = m.Gauge.GetValue()
			case m.Histogram != nil:
				s.value = float64(m.Histogram.GetSampleCount())
			}
			out[name] = append(out[name], s)
		}
	}
	return out
}

type sample struct {
	labels map[string]string
	value  float64
}

func sum(fams map[string][]sample, name string, want ...string) float64 {
	total := 0.0
	for _, s := range fams[name] {
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			if s.labels[want[i]] != want[i+1] {
				ok = false
			}
		}
		if ok {
			total += s.value
		}
	}
	return total
}

func TestMetricsPresentAndMoving(t *testing.T) {
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"usage":{"prompt_tokens":300,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":256}}}`)
	})
	failing := kvtest.NewReplica(t, "f", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(502) })
	k := kvtest.Start(t, []*kvtest.Replica{a, failing}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Retries = 1
	})
	before := scrape(t, k.Admin)
	prompt := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("tok ", 600) + `"}]}`
	for i := 0; i < 6; i++ {
		resp, body := kvtest.Post(t, k.URL+"/v1/chat/completions", prompt, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}
	kvtest.Post(t, k.URL+"/v1/chat/completions", `{"messages":5}`, nil)
	after := scrape(t, k.Admin)

	moved := []struct {
		name   string
		labels []string
	}{
		{"kvroute_requests_total", []string{"endpoint", "/v1/chat/completions", "backend", "a", "status", "200"}},
		{"kvroute_requests_total", []string{"status", "400"}},
		{"kvroute_routing_decision_seconds", nil},
		{"kvroute_matched_tokens", nil},
		{"kvroute_matched_tokens_total", nil},
		{"kvroute_key_tokens_total", nil},
		{"kvroute_predicted_cached_tokens_total", nil},
		{"kvroute_engine_cached_tokens_total", nil},
		{"kvroute_tree_tokens", nil},
		{"kvroute_tree_nodes", nil},
		{"kvroute_tree_bytes", nil},
		{"kvroute_token_cache_hits_total", []string{"kind", "message"}},
		{"kvroute_token_cache_misses_total", []string{"kind", "message"}},
		{"kvroute_token_cache_entries", []string{"kind", "message"}},
		{"kvroute_token_cache_bytes", []string{"kind", "message"}},
	}
	for _, m := range moved {
		if d := sum(after, m.name, m.labels...) - sum(before, m.name, m.labels...); d <= 0 {
			t.Errorf("%s%v did not move (%v → %v)", m.name, m.labels, sum(before, m.name, m.labels...), sum(after, m.name, m.labels...))
		}
	}
	// Cold requests pick at random between the two, so the failing replica
	// may not have been tried; when it was, the retry is counted.
	if failing.Hits.Load() > 0 && sum(after, "kvroute_retries_total", "backend", "f") == 0 {
		t.Error("kvroute_retries_total{backend=\"f\"} not counted")
	}
	if got := sum(after, "kvroute_engine_cached_tokens_total") - sum(before, "kvroute_engine_cached_tokens_total"); got != 6*256 {
		t.Errorf("engine cached tokens = %v, want %d", got, 6*256)
	}
	for _, name := range []string{"kvroute_backend_healthy", "kvroute_backend_in_flight", "kvroute_backend_metrics_age_seconds", "kvroute_backend_ejections_total"} {
		for _, b := range []string{"a", "f"} {
			if len(filter(after[name], "backend", b)) != 1 {
				t.Errorf("%s{backend=%q} missing", name, b)
			}
		}
	}
	if v := sum(after, "kvroute_token_cache_max_bytes"); v != 1<<20 {
		t.Errorf("token cache bound = %v, want kvtest's tokenizer.cache_bytes, 1 MiB", v)
	}
	if v := sum(after, "kvroute_backend_healthy", "backend", "a"); v != 1 {
		t.Errorf("healthy{a} = %v", v)
	}
	if v := sum(after, "kvroute_backend_in_flight"); v != 0 {
		t.Errorf("in flight after all requests = %v", v)
	}
}

func filter(s []sample, k, v string) []sample {
	var out []sample
	for _, x := range s {
		if x.labels[k] == v {
			out = append(out, x)
		}
	}
	return out
}

func TestAdminEndpoints(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Auth.AdminToken = "admin-secret"
	})
	kvtest.Post(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, k.Admin+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		path, token, want string
		status            int
	}{
		{"/healthz", "", `"ok"`, 200},
		{"/readyz", "", `"ready"`, 200},
		{"/debug/backends", "", "invalid_admin_token", 401},
		{"/debug/backends", "wrong", "invalid_admin_token", 401},
		{"/debug/backends", "admin-secret", `"healthy": true`, 200},
		{"/debug/tree", "admin-secret", `"held_tokens"`, 200},
		{"/metrics", "admin-secret", "kvroute_requests_total", 200},
		{"/debug/pprof/", "admin-secret", "goroutine", 200},
	} {
		status, body := get(c.path, c.token)
		if status != c.status || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d %.200s; want %d containing %q", c.path, status, body, c.status, c.want)
		}
	}
}
