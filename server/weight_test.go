package server_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// TestWeightsAndBackupEndToEnd runs kvroute in front of primaries a
// (weight 3) and b (weight 1) and a backup c, for every policy: c gets no
// request while a primary is up, takes every request once both are
// ejected, and is left again when a comes back. Under round_robin the
// primaries share requests 3:1. A reload that makes c a primary puts it
// back in rotation.
func TestWeightsAndBackupEndToEnd(t *testing.T) {
	for _, policy := range []string{"round_robin", "least_load", "cache_aware", "session"} {
		t.Run(policy, func(t *testing.T) {
			a := kvtest.NewReplica(t, "a", nil)
			b := kvtest.NewReplica(t, "b", nil)
			c := kvtest.NewReplica(t, "c", nil)
			k := kvtest.Start(t, []*kvtest.Replica{a, b, c}, func(cfg *config.Config) {
				cfg.Policy = policy
				cfg.Backends[0].Weight = 3
				cfg.Backends[2].Backup = true
			})
			// Each call uses new users (sessions), so that session
			// stickiness does not carry a phase's placement into the next.
			phase := 0
			send := func(n int) {
				t.Helper()
				phase++
				for i := range n {
					body := fmt.Sprintf(`{"model":"m1","user":"u%d-%d","messages":[{"role":"user","content":"request %d of phase %d, a test of weights and backups"}]}`, phase, i, i, phase)
					resp, b := postJSON(t, k.URL+"/v1/chat/completions", body)
					if resp.StatusCode != 200 {
						t.Fatalf("status %d: %s", resp.StatusCode, b)
					}
				}
			}
			hits := func() [3]int64 { return [3]int64{a.Hits.Load(), b.Hits.Load(), c.Hits.Load()} }

			send(16)
			if h := hits(); h[2] != 0 || h[0]+h[1] != 16 {
				t.Fatalf("primaries up: hits a,b,c = %v, want none on the backup c", h)
			}
			if h := hits(); policy == "round_robin" && (h[0] != 12 || h[1] != 4) {
				t.Errorf("round_robin over weights 3:1: hits a,b = %d,%d, want 12,4", h[0], h[1])
			}

			a.Healthy.Store(false)
			b.Healthy.Store(false)
			kvtest.WaitFor(t, 5*time.Second, "a and b ejected", func() bool {
				return !k.Srv.Fleet.ByName("a").Healthy() && !k.Srv.Fleet.ByName("b").Healthy()
			})
			before := hits()
			send(6)
			if h := hits(); h[0] != before[0] || h[1] != before[1] || h[2] != 6 {
				t.Fatalf("primaries down: hits a,b,c went %v → %v, want all 6 on c", before, h)
			}

			a.Healthy.Store(true)
			kvtest.WaitFor(t, 5*time.Second, "a back in service", func() bool { return k.Srv.Fleet.ByName("a").Healthy() })
			before = hits()
			send(6)
			if h := hits(); h[0] != before[0]+6 || h[2] != before[2] {
				t.Fatalf("a back: hits a,b,c went %v → %v, want all 6 on a", before, h)
			}

			next := *k.Srv.Config()
			next.Backends = slices.Clone(next.Backends)
			next.Backends[2].Backup = false
			if err := k.Srv.Reload(context.Background(), &next); err != nil {
				t.Fatal(err)
			}
			before = hits()
			send(16)
			if h := hits(); h[2] == before[2] || h[1] != before[1] {
				t.Errorf("c made a primary by reload (b still down): hits a,b,c went %v → %v, want some on c", before, h)
			}
		})
	}
}
