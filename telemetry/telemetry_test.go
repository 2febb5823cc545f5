package telemetry_test

import (
	"maps"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/race"
	"github.com/kvroute/kvroute/telemetry"
)

func testFleet(t *testing.T, names ...string) *backends.Fleet {
	t.Helper()
	specs := make([]backends.Spec, 0, len(names))
	for i, n := range names {
		specs = append(specs, backends.Spec{Name: n, URL: "http://127.0.0.1:" + string(rune('1'+i)) + "9999", Engine: backends.EngineVLLM, Models: []string{"m1"}})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// gather returns the registry's families by name.
func gather(t *testing.T, m *telemetry.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// find returns the metric of family name whose labels are exactly want.
func find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		got := labels(m)
		if len(got) != len(want) {
			continue
		}
		same := true
		for k, v := range want {
			if got[k] != v {
				same = false
			}
		}
		if same {
			return m
		}
	}
	return nil
}

func TestStatusClass(t *testing.T) {
	for status, want := range map[int]string{100: "1xx", 200: "2xx", 204: "2xx", 304: "3xx", 400: "4xx", 499: "4xx", 500: "5xx", 599: "5xx", 0: "unknown", 600: "unknown", -1: "unknown"} {
		if got := telemetry.StatusClass(status); got != want {
			t.Errorf("StatusClass(%d) = %q, want %q", status, got, want)
		}
	}
}

// A request is counted once and observed in both histograms under its
// endpoint, backend and status class; counting it again allocates nothing.
func TestRequestCountsAndLatency(t *testing.T) {
	m := telemetry.New(testFleet(t, "gpu-a"), nil)
	m.Request("/v1/chat/completions", "gpu-a", 200, "cache_hit matched=512", 150*time.Millisecond, 2*time.Second)
	m.Request("/v1/chat/completions", "gpu-a", 201, "cache_hit matched=64", 0, time.Second) // no body byte: no ttfb
	m.Request("other", "", 401, "", time.Millisecond, time.Millisecond)
	fams := gather(t, m)

	for _, c := range []struct {
		status, route string
		want          float64
	}{{"200", "cache_hit", 1}, {"201", "cache_hit", 1}} {
		got := find(fams, "kvroute_requests_total", map[string]string{"endpoint": "/v1/chat/completions", "backend": "gpu-a", "status": c.status, "route": c.route})
		if got.GetCounter().GetValue() != c.want {
			t.Errorf("requests_total{status=%s} = %v, want %v", c.status, got.GetCounter().GetValue(), c.want)
		}
	}
	ok := map[string]string{"endpoint": "/v1/chat/completions", "backend": "gpu-a", "status_class": "2xx"}
	dur := find(fams, "kvroute_request_duration_seconds", ok).GetHistogram()
	if dur.GetSampleCount() != 2 || dur.GetSampleSum() != 3 {
		t.Errorf("duration{2xx}: count %d sum %v, want 2 and 3", dur.GetSampleCount(), dur.GetSampleSum())
	}
	ttfb := find(fams, "kvroute_time_to_first_byte_seconds", ok).GetHistogram()
	if ttfb.GetSampleCount() != 1 || ttfb.GetSampleSum() != 0.15 {
		t.Errorf("ttfb{2xx}: count %d sum %v, want 1 and 0.15", ttfb.GetSampleCount(), ttfb.GetSampleSum())
	}
	bounds := make([]float64, 0, len(dur.GetBucket()))
	for _, b := range dur.GetBucket() {
		bounds = append(bounds, b.GetUpperBound())
	}
	if bounds[0] > 0.01 || bounds[len(bounds)-1] < 300 {
		t.Errorf("duration buckets %v do not span milliseconds to minutes", bounds)
	}
	denied := map[string]string{"endpoint": "other", "backend": "", "status_class": "4xx"}
	if h := find(fams, "kvroute_request_duration_seconds", denied); h.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("duration{other,4xx} missing or wrong: %v", h)
	}

	// Labels that alias a reused buffer are copied, not kept.
	buf := []byte("gpu-b")
	m.Request("/v1/completions", string(buf), 200, "cold", time.Millisecond, time.Millisecond)
	copy(buf, "XXXXX")
	if find(gather(t, m), "kvroute_requests_total", map[string]string{"endpoint": "/v1/completions", "backend": "gpu-b", "status": "200", "route": "cold"}) == nil {
		t.Error("series for backend gpu-b lost its label")
	}

	allocs := testing.AllocsPerRun(100, func() {
		m.Request("/v1/chat/completions", "gpu-a", 200, "cache_hit matched=512", 150*time.Millisecond, 2*time.Second)
	})
	if allocs > 0 && !race.Enabled {
		t.Errorf("Request allocates %.0f times per call once its series exist", allocs)
	}
}

// Counters exist at zero before anything happened: the unlabelled ones,
// reloads by result, retries for every replica, and requests_total for the
// answers kvroute writes itself.
func TestCountersStartAtZero(t *testing.T) {
	m := telemetry.New(testFleet(t, "gpu-a", "gpu-b"), nil)
	fams := gather(t, m)
	want := []struct {
		name   string
		labels map[string]string
	}{
		{"kvroute_matched_tokens_total", map[string]string{}},
		{"kvroute_key_tokens_total", map[string]string{}},
		{"kvroute_predicted_cached_tokens_total", map[string]string{"mode": "approximate"}},
		{"kvroute_predicted_cached_tokens_total", map[string]string{"mode": "precise"}},
		{"kvroute_engine_cached_tokens_total", map[string]string{"mode": "approximate"}},
		{"kvroute_engine_cached_tokens_total", map[string]string{"mode": "precise"}},
		{"kvroute_engine_prompt_tokens_total", map[string]string{"mode": "approximate"}},
		{"kvroute_engine_prompt_tokens_total", map[string]string{"mode": "precise"}},
		{"kvroute_config_reloads_total", map[string]string{"result": "ok"}},
		{"kvroute_config_reloads_total", map[string]string{"result": "rejected"}},
		{"kvroute_retries_total", map[string]string{"backend": "gpu-a"}},
		{"kvroute_retries_total", map[string]string{"backend": "gpu-b"}},
		{"kvroute_client_write_timeouts_total", map[string]string{"backend": "gpu-a"}},
		{"kvroute_client_write_timeouts_total", map[string]string{"backend": "gpu-b"}},
		{"kvroute_streams_polled_total", map[string]string{"backend": "gpu-a"}},
		{"kvroute_streams_polled_total", map[string]string{"backend": "gpu-b"}},
		{"kvroute_backend_ejections_total", map[string]string{"backend": "gpu-a"}},
	}
	check := func(name string, labels map[string]string) {
		got := find(fams, name, labels)
		if got == nil {
			t.Errorf("%s%v missing", name, labels)
			return
		}
		if v := got.GetCounter().GetValue(); v != 0 {
			t.Errorf("%s%v = %v, want 0", name, labels, v)
		}
	}
	for _, w := range want {
		check(w.name, w.labels)
	}
	for _, e := range telemetry.Endpoints {
		for _, s := range []string{"400", "401", "408", "413", "414", "431", "499", "503"} {
			check("kvroute_requests_total", map[string]string{"endpoint": e, "backend": "", "status": s, "route": ""})
		}
	}
}

// kvroute_tree_held_tokens and kvroute_tree_held_exact_tokens name each
// replica by its backend name, each counting its own share of the Index.
func TestTreeHeldTokensByBackendName(t *testing.T) {
	fleet := testFleet(t, "gpu-a", "gpu-b", "gpu-c")
	ix := index.New(index.Options{KeyBlock: 16})
	reps := fleet.Replicas()
	now := time.Now()
	ix.RouterWriter().Place([]uint32{1, 2, 3, 4}, false, reps[1], now)
	ix.RouterWriter().Place([]uint32{1, 2, 3, 4, 5, 6}, false, reps[2], now)
	ix.EngineWriter().Place([]uint32{7, 8}, true, reps[2], now)
	ix.EngineWriter().Place([]uint32{7, 8, 9}, true, reps[0], now)
	m := telemetry.New(fleet, func() (telemetry.TreeStats, bool) { return ix.Stats(), true })
	fams := gather(t, m)
	for _, tc := range []struct {
		name string
		want map[string]float64
	}{
		{"kvroute_tree_held_tokens", map[string]float64{"gpu-b": 4 * 16, "gpu-c": 6 * 16}},
		{"kvroute_tree_held_exact_tokens", map[string]float64{"gpu-a": 3 * 16, "gpu-c": 2 * 16}},
	} {
		held := map[string]float64{}
		for _, mt := range fams[tc.name].GetMetric() {
			l := labels(mt)
			if _, ok := l["replica_id"]; ok || len(l) != 1 {
				t.Errorf("%s labels %v, want backend only", tc.name, l)
			}
			held[l["backend"]] = mt.GetGauge().GetValue()
		}
		if !maps.Equal(held, tc.want) {
			t.Errorf("%s by backend = %v, want %v", tc.name, held, tc.want)
		}
		if !strings.HasPrefix(fams[tc.name].GetHelp(), "Tokens") {
			t.Errorf("%s help %q", tc.name, fams[tc.name].GetHelp())
		}
	}
	if got := find(fams, "kvroute_tree_tokens", nil); got == nil || got.GetGauge().GetValue() != (6+3)*16 {
		t.Errorf("kvroute_tree_tokens = %v, want %d", got, (6+3)*16)
	}
}

// An answer cut by timeouts.client_write is counted by its replica.
func TestClientWriteTimeoutsCounted(t *testing.T) {
	m := telemetry.New(testFleet(t, "gpu-a", "gpu-b"), nil)
	m.ClientWriteTimeout("/v1/chat/completions", "gpu-b")
	m.ClientWriteTimeout("/v1/completions", "gpu-b")
	fams := gather(t, m)
	for backend, want := range map[string]float64{"gpu-a": 0, "gpu-b": 2} {
		got := find(fams, "kvroute_client_write_timeouts_total", map[string]string{"backend": backend})
		if got == nil || got.GetCounter().GetValue() != want {
			t.Errorf("kvroute_client_write_timeouts_total{backend=%q} = %v, want %v", backend, got, want)
		}
	}
}
