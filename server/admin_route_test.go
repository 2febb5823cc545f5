package server_test

import (
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// /debug/route tells the reason, the match length and the scores (whether
// a prompt is cached, whoever sent it) only to the holder of
// auth.admin_token, or to anyone with expose_route_reason: true; with
// neither, it names the replica and the key's size only.
func TestDebugRouteHidesTheMatchByDefault(t *testing.T) {
	prompt := `{"model":"m1","messages":[{"role":"user","content":"a prompt someone else may have sent"}]}`
	for _, c := range []struct {
		name   string
		token  string
		expose bool
		shown  bool
	}{
		{"defaults", "", config.Default().ExposeRouteReason, false},
		{"admin token", "s3cret", false, true},
		{"expose_route_reason", "", true, true},
	} {
		rep := kvtest.NewReplica(t, "r", nil)
		k := kvtest.Start(t, []*kvtest.Replica{rep}, func(cfg *config.Config) {
			cfg.Policy = "cache_aware"
			cfg.Auth.AdminToken = c.token
			cfg.ExposeRouteReason = c.expose
		})
		var hdr map[string]string
		if c.token != "" {
			hdr = map[string]string{"Authorization": "Bearer " + c.token}
		}
		resp, b := kvtest.Post(t, k.Admin+"/debug/route", prompt, hdr) //nolint:bodyclose // Post reads and closes the body
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", c.name, resp.StatusCode, b)
		}
		if out["replica"] != "r" {
			t.Errorf("%s: %s", c.name, b)
		}
		for _, key := range []string{"route", "matched", "scores"} {
			if _, ok := out[key]; ok != c.shown {
				t.Errorf("%s: %q in the answer: %v, want %v: %s", c.name, key, ok, c.shown, b)
			}
		}
	}
}
