package router_test

import (
	"fmt"
	"github.com/kvroute/kvroute/index"
	"runtime"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/internal/liveheap"
	"github.com/kvroute/kvroute/router"
)

func routeFleet(t testing.TB, n int) *backends.Fleet {
	t.Helper()
	specs := make([]backends.Spec, 0, n)
	for i := range n {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 21000+i), Engine: backends.EngineVLLM})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// longID is a distinct id of n bytes, in memory of its own (as a session
// header copied out of a request is).
func longID(i, n int) string {
	b := make([]byte, n)
	for j := range b {
		b[j] = 'a' + byte(j%26)
	}
	copy(b, strconv.Itoa(i)+"-")
	return string(b)
}

// Binding 20,000 session IDs of 16 KiB each through Router.Route keeps
// digests only: the heap grows by a few MB, not the 320 MB the IDs weigh,
// whether the IDs are rejected for their length (the default bound) or
// hashed and bound (a bound raised above them). The decisions, whose undo
// closures were another place an ID could stay, are kept alive meanwhile.
func TestSessionTableHeapThroughRoute(t *testing.T) {
	const n, size, bound = 20000, 16 << 10, 20 << 20
	policies := []struct {
		name string
		make func(*router.Sessions) router.Policy
	}{
		{"session", func(s *router.Sessions) router.Policy { return router.NewSessionPolicy(s, 0.25) }},
		{"cache_aware", func(s *router.Sessions) router.Policy {
			return router.NewCacheAware(router.CacheAwareOptions{CacheAwareConfig: router.CacheAwareConfig{Lambda: 2048, Mu: 4096, Epsilon: 0.25, MinMatchTokens: 256}, Index: index.Options{TTL: time.Minute, BlockSize: 16, DefaultBudget: 1 << 20, MaxBytes: 64 << 20}}, s)
		}},
	}
	bounds := []struct {
		name       string
		maxIDBytes int
		held       int   // sessions the table holds after
		rejected   int64 // IDs rejected
	}{
		{"default id bound rejects", 0, 0, n},
		{"raised id bound hashes", 1 << 20, n, 0},
	}
	for _, pc := range policies {
		for _, bc := range bounds {
			t.Run(pc.name+"/"+bc.name, func(t *testing.T) {
				fleet := routeFleet(t, 3)
				sessions := router.NewSessions(time.Hour)
				sessions.SetLimits(0, bc.maxIDBytes)
				rt := router.New(fleet, pc.make(sessions))
				decs := make([]router.Decision, 0, n)
				before := liveheap.Bytes()
				for i := range n {
					req := &router.Request{Session: longID(i, size)}
					dec, err := rt.Route(req, nil)
					if err != nil {
						t.Fatal(err)
					}
					dec.Started()
					decs = append(decs, dec)
				}
				after := liveheap.Bytes()
				st := sessions.Stats()
				if st.Entries != bc.held || st.Rejected != bc.rejected {
					t.Fatalf("table holds %d sessions, rejected %d; want %d, %d", st.Entries, st.Rejected, bc.held, bc.rejected)
				}
				if grew := int64(after) - int64(before); grew > bound {
					t.Errorf("heap grew %d MB binding %d IDs of %d bytes, want < %d MB", grew>>20, n, size, bound>>20)
				} else {
					t.Logf("heap grew %d KB for %d IDs of %d bytes", grew>>10, n, size)
				}
				runtime.KeepAlive(rt)
				runtime.KeepAlive(decs)
			})
		}
	}
}
