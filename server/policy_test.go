package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
)

// lastByName is a policy defined here, in a test file, to show that a new
// policy is its own code plus one registration: it sends every request to
// the candidate whose name sorts last.
type lastByName struct{}

func (lastByName) Name() string { return "test_last_by_name" }

func (lastByName) Pick(_ *router.Request, cands []*backends.Replica) router.Decision {
	best := cands[0]
	for _, c := range cands[1:] {
		if c.Name() > best.Name() {
			best = c
		}
	}
	return router.Decision{Replica: best, Reason: "last_by_name"}
}

func init() {
	if err := router.Register(router.Entry{Name: "test_last_by_name", Summary: "the candidate whose name sorts last (a test policy)",
		New: func(router.Deps) router.Policy { return lastByName{} }}); err != nil {
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
		c.CacheAware.Lambda, c.CacheAware.Mu, c.CacheAware.Nu = 1000, 2000, 0.2
		c.CacheAware.Epsilon, c.CacheAware.MinMatchTokens, c.CacheAware.TTL = 0.5, 128, 20*time.Minute
		c.CacheAware.DefaultBudgetTokens = 300000
		c.Session.Epsilon = 0.5
	})
	if got := k.Srv.Router.Tuning().CacheAware; got.Lambda != 1000 || got.MinMatchTokens != 128 || got.TTL != 20*time.Minute {
		t.Errorf("tuning after the reload: %+v", got)
	}
	hit("after a tuning reload")
	reload(func(c *config.Config) { c.Policy = "round_robin" })
	reload(func(c *config.Config) { c.Policy = "cache_aware" })
	hit("after round_robin and back")
	if w := k.Srv.Index().Writes(router.SourceRouter); w < 3 {
		t.Errorf("the index counts %d placements by this router, want at least 3", w)
	}
}
