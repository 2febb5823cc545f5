package server_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// scrape reads and parses the admin /metrics.
func scrape(t testing.TB, admin string) map[string][]sample {
	t.Helper()
	resp, err := httpGet(t, http.DefaultClient, admin+"/metrics")
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
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, _ *http.Request) {
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
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", prompt)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d %s", resp.StatusCode, body)
		}
	}
	postJSON(t, k.URL+"/v1/chat/completions", `{"messages":5}`)
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
	if role := filter(after["kvroute_backend_role"], "backend", "a"); len(role) != 1 || sum(after, "kvroute_backend_role", "backend", "a", "role", "both") != 1 {
		t.Errorf("kvroute_backend_role{backend=\"a\"} = %v, want role both", role)
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
	postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody)
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, k.Admin+path, nil)
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

// families reads the admin /metrics as parsed metric families.
func families(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := httpGet(t, http.DefaultClient, admin+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("admin /metrics does not parse: %v", err)
	}
	return fams
}

// metricWith returns the metric of fams[name] whose labels include want.
func metricWith(fams map[string]*dto.MetricFamily, name string, want ...string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(want); i += 2 {
			if v, has := got[want[i]]; !has || v != want[i+1] {
				ok = false
			}
		}
		if ok {
			return m
		}
	}
	return nil
}

// Request duration and time to first byte are histograms by endpoint,
// backend and status class; a stream's time to first byte is its first
// event, not its headers.
func TestLatencyHistograms(t *testing.T) {
	a := kvtest.NewReplica(t, "gpu-a", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			w.(http.Flusher).Flush() // headers now, the first token later
			time.Sleep(250 * time.Millisecond)
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
			return
		}
		kvtest.Echo(w, r, nil)
	})
	k := kvtest.Start(t, []*kvtest.Replica{a})
	for i := 0; i < 2; i++ {
		if resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody); resp.StatusCode != 200 {
			t.Fatalf("chat: %d %s", resp.StatusCode, body)
		}
	}
	if resp, body := postJSON(t, k.URL+"/v1/completions", `{"model":"m1","prompt":"hi","stream":true}`); resp.StatusCode != 200 {
		t.Fatalf("stream: %d %s", resp.StatusCode, body)
	}
	postJSON(t, k.URL+"/v1/chat/completions", `{"messages":5}`)
	fams := families(t, k.Admin)

	for _, c := range []struct {
		name, endpoint, backend, class string
		count                          uint64
	}{
		{"kvroute_request_duration_seconds", "/v1/chat/completions", "gpu-a", "2xx", 2},
		{"kvroute_time_to_first_byte_seconds", "/v1/chat/completions", "gpu-a", "2xx", 2},
		{"kvroute_request_duration_seconds", "/v1/completions", "gpu-a", "2xx", 1},
		{"kvroute_time_to_first_byte_seconds", "/v1/completions", "gpu-a", "2xx", 1},
		{"kvroute_request_duration_seconds", "/v1/chat/completions", "", "4xx", 1},
	} {
		m := metricWith(fams, c.name, "endpoint", c.endpoint, "backend", c.backend, "status_class", c.class)
		if m == nil || m.GetHistogram() == nil {
			t.Errorf("%s{endpoint=%q,backend=%q,status_class=%q} missing", c.name, c.endpoint, c.backend, c.class)
			continue
		}
		if n := m.GetHistogram().GetSampleCount(); n != c.count {
			t.Errorf("%s{%s,%s,%s} count %d, want %d", c.name, c.endpoint, c.backend, c.class, n, c.count)
		}
	}
	ttfb := metricWith(fams, "kvroute_time_to_first_byte_seconds", "endpoint", "/v1/completions")
	dur := metricWith(fams, "kvroute_request_duration_seconds", "endpoint", "/v1/completions", "backend", "gpu-a")
	if ttfb == nil || dur == nil {
		t.Fatal("stream series missing")
	}
	if s := ttfb.GetHistogram().GetSampleSum(); s < 0.25 || s > dur.GetHistogram().GetSampleSum() {
		t.Errorf("stream ttfb %.3fs: want at least the 0.25s before its first event and at most its duration %.3fs", s, dur.GetHistogram().GetSampleSum())
	}
	buckets := ttfb.GetHistogram().GetBucket()
	if len(buckets) < 10 || buckets[0].GetUpperBound() > 0.01 || buckets[len(buckets)-1].GetUpperBound() < 300 {
		t.Errorf("ttfb buckets do not span milliseconds to minutes: %v", buckets)
	}
}

// A fresh kvroute already shows its counters at zero, per replica where
// they are per replica (replicas added by a reload included), and
// kvroute_tree_held_tokens names replicas by backend name.
func TestCountersAtZeroAndHeldTokensByName(t *testing.T) {
	a := kvtest.NewReplica(t, "gpu-a", nil)
	b := kvtest.NewReplica(t, "gpu-b", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(c *config.Config) { c.Policy = "cache_aware" })
	fams := families(t, k.Admin)
	for _, w := range [][]string{
		{"kvroute_requests_total", "endpoint", "/v1/chat/completions", "backend", "", "status", "503", "route", ""},
		{"kvroute_requests_total", "endpoint", "other", "backend", "", "status", "400", "route", ""},
		{"kvroute_retries_total", "backend", "gpu-a"},
		{"kvroute_retries_total", "backend", "gpu-b"},
		{"kvroute_config_reloads_total", "result", "ok"},
		{"kvroute_config_reloads_total", "result", "rejected"},
		{"kvroute_matched_tokens_total"},
		{"kvroute_key_tokens_total"},
		{"kvroute_engine_cached_tokens_total"},
		{"kvroute_backend_ejections_total", "backend", "gpu-b"},
	} {
		m := metricWith(fams, w[0], w[1:]...)
		if m == nil || m.GetCounter() == nil {
			t.Errorf("%v missing on a fresh kvroute", w)
		} else if v := m.GetCounter().GetValue(); v != 0 {
			t.Errorf("%v = %v on a fresh kvroute", w, v)
		}
	}

	c := kvtest.NewReplica(t, "gpu-c", nil)
	next := *k.Srv.Config()
	next.Backends = append(append([]config.Backend(nil), next.Backends...), config.Backend{Name: "gpu-c", URL: c.URL(), Engine: "vllm"})
	if err := k.Srv.Reload(context.Background(), &next); err != nil {
		t.Fatal(err)
	}
	if metricWith(families(t, k.Admin), "kvroute_retries_total", "backend", "gpu-c") == nil {
		t.Error("kvroute_retries_total{backend=\"gpu-c\"} missing after the reload that added it")
	}

	prompt := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("held tokens ", 400) + `"}]}`
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", prompt)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	served := resp.Header.Get("X-Kvroute-Backend")
	held := families(t, k.Admin)["kvroute_tree_held_tokens"]
	if held == nil || len(held.GetMetric()) == 0 {
		t.Fatal("kvroute_tree_held_tokens missing after a routed request")
	}
	for _, m := range held.GetMetric() {
		if len(m.GetLabel()) != 1 || m.GetLabel()[0].GetName() != "backend" {
			t.Errorf("kvroute_tree_held_tokens labels %v, want backend only", m.GetLabel())
			continue
		}
		if name := m.GetLabel()[0].GetValue(); name != served || m.GetGauge().GetValue() <= 0 {
			t.Errorf("kvroute_tree_held_tokens{backend=%q} = %v; the request went to %q", name, m.GetGauge().GetValue(), served)
		}
	}
}

// The proxy's gauges say what it holds: open connections and requests in
// flight while a client keeps one open, and zero body buffers once done.
func TestProxyGauges(t *testing.T) {
	a := kvtest.NewReplica(t, "gpu-a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a})
	conn, err := dialTCP(t, strings.TrimPrefix(k.URL, "http://"), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(kvtest.ChatBody)) + "\r\n\r\n" + kvtest.ChatBody
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	gauge := func(fams map[string]*dto.MetricFamily, name string) float64 {
		m := metricWith(fams, name)
		if m == nil || m.GetGauge() == nil {
			t.Fatalf("%s missing", name)
		}
		return m.GetGauge().GetValue()
	}
	fams := families(t, k.Admin)
	// The kept-alive connection above, and the scrape's own request is not
	// on the proxy listener.
	if c := gauge(fams, "kvroute_client_connections"); c != 1 {
		t.Errorf("kvroute_client_connections = %v, want 1", c)
	}
	if n := gauge(fams, "kvroute_in_flight_requests"); n != 0 {
		t.Errorf("kvroute_in_flight_requests = %v after the answer, want 0", n)
	}
	if b := gauge(fams, "kvroute_body_buffer_bytes"); b != 0 {
		t.Errorf("kvroute_body_buffer_bytes = %v after the answer, want 0", b)
	}
}
