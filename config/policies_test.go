package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router"
)

// Each policy's section decodes into its own configuration type, from the
// file and from the environment, and its errors name the key with its line.
func TestPolicySections(t *testing.T) {
	c, err := LoadBytes("config.yaml", []byte(minimal+"policies:\n  cache_aware:\n    lambda: 1000\n    turn_price: 0.5\n  session:\n    epsilon: 1\n"),
		[]string{"KVROUTE_POLICIES_CACHE_AWARE_MIN_MATCH_TOKENS=128"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, ok := c.PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig)
	if !ok {
		t.Fatalf("PolicyConfig(cache_aware) = %T", c.PolicyConfig(router.CacheAwareName))
	}
	want := router.CacheAwareConfig{Lambda: 1000, Mu: 4096, Nu: 0.1, Epsilon: 0.25, BoundFloor: 8, MinMatchTokens: 128, BranchBalance: 1.25, TurnPrice: 0.5}
	if *ca != want {
		t.Errorf("cache_aware = %+v, want %+v", *ca, want)
	}
	if s := c.PolicyConfig(router.SessionName).(*router.SessionConfig); s.Epsilon != 1 {
		t.Errorf("session epsilon = %v, want 1", s.Epsilon)
	}
	if got := c.PolicyConfig(router.RoundRobinName); got != nil {
		t.Errorf("round_robin, which has no settings, has %v", got)
	}
	if len(c.Deprecated) != 0 {
		t.Errorf("warnings %q for a configuration without deprecated keys", c.Deprecated)
	}
	for _, tc := range []struct{ body, want string }{
		{"policies:\n  cache_aware:\n    lamda: 1\n", `config.yaml:7: unknown key "policies.cache_aware.lamda" (did you mean "policies.cache_aware.lambda"?)`},
		{"policies:\n  cache_aware:\n    mu: lots\n", `config.yaml:7: policies.cache_aware.mu: "lots" is not a number`},
		{"policies:\n  cache_aware:\n    turn_price: 3\n", `config.yaml:7: policies.cache_aware.turn_price: must be from 0 to 1, got 3`},
		{"policies:\n  least_load:\n    x: 1\n", `config.yaml:6: unknown key "policies.least_load" (known keys here: cache_aware, session`},
	} {
		got := loadErr(t, minimal+tc.body, nil)
		if !strings.Contains(got, tc.want) {
			t.Errorf("%q:\n got %s\nwant a line beginning %s", tc.body, got, tc.want)
		}
	}
}

// The cache_aware section of earlier releases, and session.epsilon, are
// read as the keys that replaced them, each with a warning naming where it
// was set; setting both the old and the new key is an error.
func TestDeprecatedKeys(t *testing.T) {
	c, err := LoadBytes("config.yaml", []byte(minimal+"cache_aware:\n  lambda: 512\n  ttl: 20m\n  tree_max_bytes: 1048576\nsession:\n  epsilon: 2\n"),
		[]string{"KVROUTE_CACHE_AWARE_NU=0.5"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca := c.PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig)
	if ca.Lambda != 512 || ca.Nu != 0.5 || ca.Mu != 4096 {
		t.Errorf("cache_aware = %+v: want lambda 512 and nu 0.5 from the old keys, mu the default", *ca)
	}
	if c.Index.TTL != 20*time.Minute || c.Index.TreeMaxBytes != 1<<20 || c.Index.BlockSize != 16 {
		t.Errorf("index = %+v: want ttl 20m and tree_max_bytes 1 MiB from the old keys", c.Index)
	}
	if s := c.PolicyConfig(router.SessionName).(*router.SessionConfig); s.Epsilon != 2 {
		t.Errorf("session epsilon = %v, want 2", s.Epsilon)
	}
	want := []string{
		"config.yaml:6: cache_aware.lambda is deprecated; write policies.cache_aware.lambda",
		"config.yaml:8: cache_aware.tree_max_bytes is deprecated; write index.tree_max_bytes",
		"config.yaml:7: cache_aware.ttl is deprecated; write index.ttl",
		"config.yaml:10: session.epsilon is deprecated; write policies.session.epsilon",
		"environment variable KVROUTE_CACHE_AWARE_NU: cache_aware.nu is deprecated; write policies.cache_aware.nu",
	}
	for _, w := range want {
		found := false
		for _, d := range c.Deprecated {
			found = found || d == w
		}
		if !found {
			t.Errorf("no warning %q in %q", w, c.Deprecated)
		}
	}
	if len(c.Deprecated) != len(want) {
		t.Errorf("%d warnings, want %d: %q", len(c.Deprecated), len(want), c.Deprecated)
	}
	got := loadErr(t, minimal+"cache_aware:\n  lambda: 512\npolicies:\n  cache_aware:\n    lambda: 1\n", nil)
	wantLines(t, got, "config.yaml:6: cache_aware.lambda: is deprecated and policies.cache_aware.lambda is set too (config.yaml:9); keep policies.cache_aware.lambda only")
	got = loadErr(t, minimal+"cache_aware:\n  turn_price: 7\n", nil)
	wantLines(t, got, "config.yaml:6: policies.cache_aware.turn_price: must be from 0 to 1, got 7")
}

// Copying a Config copies its policies' settings: UpdatePolicy on the copy
// leaves the original as it was.
func TestUpdatePolicyCopies(t *testing.T) {
	a := Default()
	b := *a
	if err := UpdatePolicy(&b, router.CacheAwareName, func(c *router.CacheAwareConfig) { c.Lambda = 7 }); err != nil {
		t.Fatal(err)
	}
	if got := b.PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig).Lambda; got != 7 {
		t.Errorf("copy's lambda = %v, want 7", got)
	}
	if got := a.PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig).Lambda; got != 2048 {
		t.Errorf("original's lambda = %v, want 2048 unchanged", got)
	}
	if err := UpdatePolicy(&b, router.CacheAwareName, func(*router.SessionConfig) {}); err == nil {
		t.Error("UpdatePolicy with the wrong type succeeded")
	}
	if !reflect.DeepEqual(Default().Policies, a.Policies) {
		t.Error("two defaults differ")
	}
}
