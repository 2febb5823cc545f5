package overhead

import (
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/oai"
	kvrouter "github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// benchRouter builds a router with policy in front of 4 vLLM backends
// (never contacted: the benchmarks route, they do not forward).
func benchRouter(b *testing.B, policy string) *server.Server {
	cfg := config.Default()
	cfg.Policy = policy
	for i := 0; i < 4; i++ {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: fmt.Sprintf("up-%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 21000+i), Engine: "vllm"})
	}
	srv, err := server.Build(cfg, zap.NewNop())
	if err != nil {
		b.Fatal(err)
	}
	return srv
}

// routeBody does what the proxy does with a chat body before forwarding
// it (server.Decide): parse it in place, build its routing key and decide.
func routeBody(b *testing.B, srv *server.Server, bufs *oai.Buffers, body []byte) kvrouter.Decision {
	dec, err := srv.Decide(bufs, oai.KindChat, body, nil)
	if err != nil {
		b.Fatal(err)
	}
	return dec
}

// BenchmarkRoutingMultiTurn is the router's own work per request of the
// multi-turn scenario, without the network: parse the body, build the
// routing key (tokenizing the two messages each turn adds, which no cache
// has seen) and decide, for 64 conversations growing to 32 KiB in turn.
// Comparing the policies shows what prefix routing adds to a request on
// one core; `kvroute bench overhead` measures the same over real sockets.
func BenchmarkRoutingMultiTurn(b *testing.B) {
	for _, policy := range []string{"round_robin", "cache_aware"} {
		b.Run("policy="+policy, func(b *testing.B) {
			srv := benchRouter(b, policy)
			const convs, batch = 64, 1024
			gens := make([]*multiTurnGen, convs)
			for i := range gens {
				gens[i] = newMultiTurnGen(1, i, 32<<10)
			}
			// Bodies are generated a batch at a time outside the timer.
			bodies := make([][]byte, batch)
			fill := func(from int) {
				for j := range bodies {
					g := gens[(from+j)%convs]
					bodies[j] = append(bodies[j][:0], g.next()...)
					g.answered(true)
				}
			}
			var bufs oai.Buffers
			var inflight [convs]kvrouter.Decision
			route := func(i int) {
				dec := routeBody(b, srv, &bufs, bodies[i%batch])
				// 64 requests in flight, as in the socket benchmark: the
				// one 64 back has its answer now.
				slot := &inflight[i%convs]
				slot.Started()
				*slot = dec
			}
			// Warm up until the token cache is full and the tree evicts,
			// as in a router that has run for a while: what is measured
			// is the steady state, not the heap growing.
			const warm = 16 * batch
			for i := 0; i < warm; i++ {
				if i%batch == 0 {
					fill(i)
				}
				route(i)
			}
			var bytes int64
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%batch == 0 {
					b.StopTimer()
					fill(warm + i)
					b.StartTimer()
				}
				bytes += int64(len(bodies[i%batch]))
				route(i)
			}
			b.ReportMetric(float64(bytes)/float64(b.N), "body-bytes/op")
		})
	}
}
