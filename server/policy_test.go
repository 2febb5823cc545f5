package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// lastByName is a policy defined here, in a test file, to show that a new
// policy with settings is its own code plus one registration: it sends
// every request to the candidate whose name sorts last, or rank places
// before it. Its settings are read from policies.test_last_by_name.
type lastByName struct {
	cfg *router.Live[lastByNameConfig]
}

// lastByNameConfig is test_last_by_name's section.
type lastByNameConfig struct {
	// Rank counts back from the last name. Default 0.
	Rank int `mapstructure:"rank"`
}

func (c *lastByNameConfig) Validate() error {
	if c.Rank < 0 {
		return &router.FieldError{Key: "rank", Msg: "must not be negative"}
	}
	return nil
}

func (lastByName) Name() string { return "test_last_by_name" }

func (p lastByName) Pick(_ *router.Request, cands []*backends.Replica) router.Decision {
	sorted := slices.SortedFunc(slices.Values(cands), func(a, b *backends.Replica) int { return strings.Compare(b.Name(), a.Name()) })
	return router.Decision{Replica: sorted[min(p.cfg.Load().Rank, len(sorted)-1)], Reason: "last_by_name"}
}

func init() {
	if err := router.Register(router.Module[lastByNameConfig]{Name: "test_last_by_name", Summary: "the candidate whose name sorts last (a test policy)",
		New: func(_ router.Deps, cfg *router.Live[lastByNameConfig]) router.Policy { return lastByName{cfg} }}); err != nil {
		panic(err)
	}
}

func TestRegisteredPolicyServes(t *testing.T) {
	if !slices.Contains(router.Names(), "test_last_by_name") {
		t.Fatal("the registered policy is not listed")
	}
	cfg := config.Default()
	cfg.Policy = "test_last_by_nam"
	cfg.Backends = []config.Backend{{Name: "a", URL: "http://127.0.0.1:1", Engine: "vllm"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "test_last_by_name") {
		t.Errorf("a misspelt policy: %v; want the registered names listed", err)
	}
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	c := kvtest.NewReplica(t, "c", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, c, b}, func(cfg *config.Config) { cfg.Policy = "test_last_by_name" })
	for i := 0; i < 5; i++ {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
		if got, route := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route"); got != "c" || route != "last_by_name" {
			t.Fatalf("request %d went to %s (%s), want c (last_by_name)", i, got, route)
		}
	}
	if a.Hits.Load()+b.Hits.Load() != 0 {
		t.Errorf("a and b got %d requests, want none", a.Hits.Load()+b.Hits.Load())
	}
	// Its section is read from the file, with line numbers in errors, and
	// from the environment; a reload changes it in place.
	body := "backends:\n  - {name: a, url: \"http://127.0.0.1:1\"}\npolicy: test_last_by_name\npolicies:\n  test_last_by_name:\n    rank: -1\n"
	if _, err := config.LoadBytes("kvroute.yaml", []byte(body), nil, nil); err == nil ||
		!strings.Contains(err.Error(), "kvroute.yaml:6: policies.test_last_by_name.rank: must not be negative") {
		t.Errorf("rank -1: %v", err)
	}
	next, err := config.LoadBytes("kvroute.yaml", []byte(body), []string{"KVROUTE_POLICIES_TEST_LAST_BY_NAME_RANK=1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := next.PolicyConfig("test_last_by_name").(*lastByNameConfig).Rank; got != 1 {
		t.Fatalf("rank from the environment = %d, want 1", got)
	}
	cfg = k.Srv.Config()
	nextCfg := *cfg
	mustUpdate(t, config.UpdatePolicy(&nextCfg, "test_last_by_name", func(c *lastByNameConfig) { c.Rank = 1 }))
	if err := k.Srv.Reload(context.Background(), &nextCfg); err != nil {
		t.Fatal(err)
	}
	resp, _ := postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	if got := resp.Header.Get("X-Kvroute-Backend"); got != "b" {
		t.Errorf("after a reload to rank 1: went to %s, want b", got)
	}
}

// A reload that changes every tuning value, or the policy and back, keeps
// the Index: the prompt's holder still gets it as a cache hit.
func TestReloadOfTuningAndPolicyKeepsTheIndex(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	b := kvtest.NewReplica(t, "b", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
	prompt := `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("alpha beta gamma ", 200) + `"}]}`
	resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt)
	holder := resp.Header.Get("X-Kvroute-Backend")
	reload := func(mod func(*config.Config)) {
		t.Helper()
		next := *k.Srv.Config()
		mod(&next)
		if err := k.Srv.Reload(context.Background(), &next); err != nil {
			t.Fatal(err)
		}
	}
	hit := func(when string) {
		t.Helper()
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt)
		if got, route := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route"); got != holder || !strings.HasPrefix(route, "cache_hit") {
			t.Errorf("%s: went to %s (%s), want %s with a cache hit", when, got, route, holder)
		}
	}
	reload(func(c *config.Config) {
		mustUpdate(t, config.UpdatePolicy(c, router.CacheAwareName, func(ca *router.CacheAwareConfig) {
			ca.Lambda, ca.Mu, ca.Nu, ca.Epsilon, ca.MinMatchTokens = 1000, 2000, 0.2, 0.5, 128
		}))
		mustUpdate(t, config.UpdatePolicy(c, router.SessionName, func(s *router.SessionConfig) { s.Epsilon = 0.5 }))
		c.Index.TTL, c.Index.DefaultBudgetTokens = 20*time.Minute, 300000
	})
	if got := k.Srv.Router.Index().TTL(); got != 20*time.Minute {
		t.Errorf("index TTL after the reload: %v", got)
	}
	hit("after a tuning reload")
	reload(func(c *config.Config) { c.Policy = "round_robin" })
	reload(func(c *config.Config) { c.Policy = "cache_aware" })
	hit("after round_robin and back")
	if w := k.Srv.Index().Writes(index.SourceRouter); w < 3 {
		t.Errorf("the index counts %d placements by this router, want at least 3", w)
	}
}

// mustUpdate fails the test on an UpdatePolicy error.
func mustUpdate(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// A deprecated key still works and is logged as a warning naming its
// replacement, at start and at each reload.
func TestDeprecatedKeysAreLogged(t *testing.T) {
	body := "backends:\n  - {name: a, url: \"http://127.0.0.1:1\"}\ncache_aware:\n  lambda: 512\n"
	cfg, err := config.LoadBytes("kvroute.yaml", []byte(body), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.WarnLevel)
	srv, err := server.Build(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	want := "configuration: kvroute.yaml:4: cache_aware.lambda is deprecated; write policies.cache_aware.lambda"
	if n := logs.FilterMessage(want).Len(); n != 1 {
		t.Fatalf("%d warnings %q at start, want 1; logged: %v", n, want, logs.All())
	}
	if err := srv.Reload(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessage(want).Len(); n != 2 {
		t.Errorf("%d warnings after a reload, want 2", n)
	}
	if got := srv.Config().PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig).Lambda; got != 512 {
		t.Errorf("lambda = %v, want 512 from the deprecated key", got)
	}
}
