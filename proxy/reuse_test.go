package proxy_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/telemetry"
)

var _ proxy.ReuseObserver = (*telemetry.Metrics)(nil)

func TestSplitReuse(t *testing.T) {
	cases := []struct {
		name                          string
		prompt, cached, matched, best int
		want                          proxy.Reuse
	}{
		{"cold fleet", 1000, 0, 0, 0, proxy.Reuse{WorkloadMiss: 1000}},
		{"hit as predicted", 1000, 992, 992, 992, proxy.Reuse{Delivered: 992, WorkloadMiss: 8}},
		{"load pick: the holder had 800", 1000, 0, 0, 800, proxy.Reuse{RoutingLoss: 800, WorkloadMiss: 200}},
		{"evicted: predicted 800, none delivered", 1000, 0, 800, 800, proxy.Reuse{IndexLoss: 800, WorkloadMiss: 200}},
		{"partly evicted, a better holder too", 1000, 300, 500, 900, proxy.Reuse{Delivered: 300, IndexLoss: 200, RoutingLoss: 400, WorkloadMiss: 100}},
		{"the engine found more than predicted", 1000, 600, 200, 400, proxy.Reuse{Delivered: 600, WorkloadMiss: 400}},
		{"cached past the prompt", 100, 150, 200, 300, proxy.Reuse{Delivered: 100}},
		{"no prompt reported", 0, 0, 64, 64, proxy.Reuse{}},
	}
	for _, c := range cases {
		if got := proxy.SplitReuse(c.prompt, c.cached, c.matched, c.best); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

// The split against its definition, on random counts: every kind is
// non-negative, the kinds sum to the prompt, delivered is what the engine
// found (within the prompt), index loss is the prediction the engine did
// not deliver, and routing loss never passes what the best candidate was
// believed to hold beyond the choice.
func TestSplitReuseProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		prompt, cached, matched := r.IntN(5000)-10, r.IntN(6000)-10, r.IntN(6000)-10
		best := matched + r.IntN(3000) - 500
		s := proxy.SplitReuse(prompt, cached, matched, best)
		if s.Delivered < 0 || s.RoutingLoss < 0 || s.IndexLoss < 0 || s.WorkloadMiss < 0 {
			t.Fatalf("(%d, %d, %d, %d): negative kind %+v", prompt, cached, matched, best, s)
		}
		if sum := s.Delivered + s.RoutingLoss + s.IndexLoss + s.WorkloadMiss; sum != max(prompt, 0) {
			t.Fatalf("(%d, %d, %d, %d): %+v sums to %d", prompt, cached, matched, best, s, sum)
		}
		if want := min(max(cached, 0), max(prompt, 0)); s.Delivered != want {
			t.Fatalf("(%d, %d, %d, %d): delivered %d, want %d", prompt, cached, matched, best, s.Delivered, want)
		}
		if want := max(min(matched, max(prompt, 0))-s.Delivered, 0); s.IndexLoss != want {
			t.Fatalf("(%d, %d, %d, %d): index loss %d, want %d", prompt, cached, matched, best, s.IndexLoss, want)
		}
		if s.RoutingLoss > max(best-max(matched, s.Delivered), 0) {
			t.Fatalf("(%d, %d, %d, %d): routing loss %d past the best's lead", prompt, cached, matched, best, s.RoutingLoss)
		}
	}
}
