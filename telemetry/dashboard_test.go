package telemetry_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/telemetry"
	"github.com/kvroute/kvroute/tokenize"
)

// The Grafana dashboard queries only metrics kvroute exports, and graphs
// time to first byte at p50, p90 and p99 and the request rate by status
// class.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../deploy/grafana/kvroute-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	m := telemetry.New(testFleet(t, "gpu-a"), func() (telemetry.TreeStats, bool) { return telemetry.TreeStats{}, true })
	m.AddTokenCache(func() tokenize.CacheStats { return tokenize.CacheStats{} })
	m.Request("/v1/chat/completions", "gpu-a", 200, "cold", time.Millisecond, time.Second) // histograms show once observed
	m.Decision(time.Microsecond, 0, 64)
	fams := gather(t, m)
	// Series that appear only once a replica reports its engine metrics or
	// the tree holds something.
	fams["kvroute_backend_waiting"], fams["kvroute_backend_kv_usage"] = nil, nil
	fams["kvroute_tree_held_tokens"], fams["kvroute_tree_held_exact_tokens"] = nil, nil

	name := regexp.MustCompile(`kvroute_[a-z_]+`)
	var exprs []string
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := n
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					base = strings.TrimSuffix(base, suffix)
				}
				if _, ok := fams[base]; !ok {
					t.Errorf("panel %q queries %s, which kvroute does not export", p.Title, n)
				}
			}
		}
	}
	all := strings.Join(exprs, "\n")
	for _, q := range []string{"0.5", "0.9", "0.99"} {
		if !strings.Contains(all, "histogram_quantile("+q+", sum by (le) (rate(kvroute_time_to_first_byte_seconds_bucket") {
			t.Errorf("no time-to-first-byte p%s panel", strings.TrimPrefix(q, "0."))
		}
	}
	if !strings.Contains(all, `label_replace(rate(kvroute_requests_total`) || !strings.Contains(all, `"status", "([0-9])[0-9][0-9]"`) {
		t.Error("no request-rate-by-status-class panel")
	}
}
