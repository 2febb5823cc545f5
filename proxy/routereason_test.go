package proxy_test

import (
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// With the default configuration no answer says why its replica was
// chosen (X-Kvroute-Route, with the prompt tokens it holds, would tell
// any client whether another's prompt is cached), not even a replica's
// own header; with expose_route_reason: true every routed answer does.
// X-Kvroute-Backend is sent either way.
func TestRouteReasonOnlyWhenExposed(t *testing.T) {
	for _, expose := range []bool{config.Default().ExposeRouteReason, true} {
		rep := kvtest.NewReplica(t, "r", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Kvroute-Route", "cache_hit matched=4096") // a replica that is a kvroute
			kvtest.Echo(w, r, nil)
		})
		k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
			c.Policy = "cache_aware"
			c.ExposeRouteReason = expose
		})
		for range 2 {
			resp, body := postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[{"role":"user","content":"a guess at another client's prompt"}]}`, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			route, backend := resp.Header.Get("X-Kvroute-Route"), resp.Header.Get("X-Kvroute-Backend")
			if backend != "r" {
				t.Errorf("expose_route_reason %v: X-Kvroute-Backend %q", expose, backend)
			}
			if expose && (route == "" || route == "cache_hit matched=4096") || !expose && route != "" {
				t.Errorf("expose_route_reason %v: X-Kvroute-Route %q", expose, route)
			}
		}
	}
}
