package overhead

import (
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// BenchmarkRoutingSmall is the router's own work per request of the small
// scenario, without the network: parse the body, build the routing key and
// decide, for unique short chat messages as `kvroute bench overhead` sends
// them, after 200,000 of them (the tree's budgets evict by then).
func BenchmarkRoutingSmall(b *testing.B) {
	for _, policy := range []string{"round_robin", "cache_aware"} {
		b.Run("policy="+policy, func(b *testing.B) {
			srv := benchRouter(b, policy)
			gen := &smallGen{run: 1, maxTokens: 16}
			var bufs oai.Buffers
			route := func() {
				dec := routeBody(b, srv, &bufs, gen.next())
				dec.Started()
			}
			for range 200_000 {
				route()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				route()
			}
		})
	}
}
