package runner

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
)

// The file a kvroute process is given loads into the configuration the
// benchmark built, and a KVROUTE_* variable the process would read over
// it is caught before the process starts.
func TestProcessConfig(t *testing.T) {
	k := &Kvroute{Policy: "cache_aware", TimeScale: 0.1, CacheTokens: 4096, RenderTimeout: 30 * time.Millisecond}
	dir := t.TempDir()
	backends := []string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}
	evs := []sim.KVEventsEndpoint{
		{Endpoint: "tcp://127.0.0.1:5557", ReplayEndpoint: "tcp://127.0.0.1:5657", Topic: "t0"},
		{Endpoint: "tcp://127.0.0.1:5558", ReplayEndpoint: "tcp://127.0.0.1:5658"},
	}
	cfg, err := k.config(backends, evs, dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.AdminListen = "127.0.0.1:8101", "127.0.0.1:8102"
	path, got := writeProcessConfig(t, dir, cfg)
	if got.Precise.RenderURL != backends[0] || got.Precise.RenderTimeout != 30*time.Millisecond {
		t.Errorf("loaded render_url %q, render_timeout %v", got.Precise.RenderURL, got.Precise.RenderTimeout)
	}
	if got.Log.Level != "info" || got.Session.TTL != cfg.Session.TTL || got.Metrics.Timeout != cfg.Metrics.Timeout ||
		got.Timeouts.Drain != cfg.Timeouts.Drain || got.Timeouts.DrainDelay != cfg.Timeouts.DrainDelay {
		t.Errorf("loaded log %q, session ttl %v, metrics timeout %v, drain %v/%v; want info, %v, %v, %v/%v", got.Log.Level,
			got.Session.TTL, got.Metrics.Timeout, got.Timeouts.Drain, got.Timeouts.DrainDelay,
			cfg.Session.TTL, cfg.Metrics.Timeout, cfg.Timeouts.Drain, cfg.Timeouts.DrainDelay)
	}
	for i, b := range got.Backends {
		w := cfg.Backends[i]
		if b.Name != w.Name || b.URL != w.URL || b.Engine != w.Engine || b.CacheTokens != w.CacheTokens || b.KVEvents == nil || !reflect.DeepEqual(*b.KVEvents, *w.KVEvents) {
			t.Errorf("backend %d loaded as %+v (kv_events %+v), want %+v (%+v)", i, b, b.KVEvents, w, w.KVEvents)
		}
	}

	t.Setenv("KVROUTE_POLICY", "round_robin")
	if err := checkProcessConfig(path, cfg); err == nil || !strings.Contains(err.Error(), "policy round_robin, want cache_aware") {
		t.Errorf("KVROUTE_POLICY=round_robin: %v, want the policy named", err)
	}
}

// Instances run in the benchmark's process: a kvroute command with them is
// refused.
func TestProcessNotWithInstances(t *testing.T) {
	o := DefaultOptions()
	o.Instances = []int{1, 2}
	o.KvrouteCommand = []string{os.Args[0], serveArg}
	if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "kvroute process: not with instances") {
		t.Errorf("instances with a kvroute command: %v", err)
	}
	o.Instances = nil
	if _, err := o.withDefaults(); err != nil {
		t.Errorf("a kvroute command alone: %v", err)
	}
}

// A split twin's process configuration carries the roles and the
// protocol.
func TestProcessConfigSplit(t *testing.T) {
	k := &Kvroute{Policy: "cache_aware", Roles: []string{"prefill", "decode"}, Split: "1:1", Protocol: "sglang"}
	dir := t.TempDir()
	cfg, err := k.Config([]string{"http://127.0.0.1:8001", "http://127.0.0.1:8002"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	_, got := writeProcessConfig(t, dir, cfg)
	if got.Disaggregation.Protocol != "sglang" || got.Backends[0].Role != "prefill" || got.Backends[1].Role != "decode" {
		t.Errorf("loaded protocol %q, roles %q %q", got.Disaggregation.Protocol, got.Backends[0].Role, got.Backends[1].Role)
	}
}

// writeProcessConfig writes cfg as the process's file in dir at log level
// info, checks it as the benchmark does before starting the process, and
// returns its path and the configuration it loads as.
func writeProcessConfig(t *testing.T, dir string, cfg *config.Config) (string, *config.Config) {
	t.Helper()
	path := filepath.Join(dir, FileKvrouteProcessConfig)
	if err := os.WriteFile(path, []byte(processYAML(cfg, "info")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkProcessConfig(path, cfg); err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return path, got
}

// A flow queue longer than kvroute's default in-flight cap (the noisy
// workload queues up to its number of requests) gets a cap above it, in
// the benchmark's configuration and in the process's: kvroute refuses a
// queue the cap would cut short.
func TestProcessConfigLongQueue(t *testing.T) {
	f := DefaultFlowOptions()
	f.MaxRunning, f.MaxQueued = 8, 15000
	k := &Kvroute{Policy: "cache_aware", TimeScale: 1, Flow: &f}
	dir := t.TempDir()
	cfg, err := k.config([]string{"http://127.0.0.1:8001"}, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Flow.MaxQueued != 15000 || cfg.Limits.MaxInflight <= cfg.Flow.MaxQueued {
		t.Fatalf("max_queued %d, max_inflight %d: want 15000 below the cap", cfg.Flow.MaxQueued, cfg.Limits.MaxInflight)
	}
	cfg.Listen, cfg.AdminListen = "127.0.0.1:8101", "127.0.0.1:8102"
	if _, got := writeProcessConfig(t, dir, cfg); got.Limits.MaxInflight != cfg.Limits.MaxInflight {
		t.Errorf("process max_inflight %d, want %d", got.Limits.MaxInflight, cfg.Limits.MaxInflight)
	}
}
