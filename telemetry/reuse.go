package telemetry

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// reuseKinds are kvroute_reuse_tokens_total's kinds, in the order of
// Reuse's counts.
var reuseKinds = [...]string{"delivered", "routing_loss", "index_loss", "workload_miss"}

// reuseMetrics split the engines' prompt tokens by whose their reuse or
// miss is (proxy/reuse.go).
type reuseMetrics struct {
	tokens      *prometheus.CounterVec
	bestOverlap prometheus.Counter
	// series are each backend's tokens counters, by kind, found once: a
	// request's split costs no label hashing.
	series sync.Map // backend → *[len(reuseKinds)]prometheus.Counter
}

func newReuseMetrics() *reuseMetrics {
	return &reuseMetrics{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_reuse_tokens_total",
			Help: "Prompt tokens engines reported, by the replica that prefilled them and kind: delivered (found cached), routing_loss (another candidate was believed to hold them: given up for load), " +
				"index_loss (the chosen replica was believed to hold them and did not), workload_miss (no replica was believed to hold them). The kinds sum to the prompt tokens.",
		}, []string{labelBackend, labelKind}),
		bestOverlap: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_decisions_best_overlap_total",
			Help: "Routed requests with a routing key whose chosen replica was believed to hold the longest prompt match of any candidate; compare with kvroute_matched_tokens_count, the routed requests with a key.",
		}),
	}
}

// Reuse counts one request's reuse split on backend (the proxy's Reuse).
func (m *Metrics) Reuse(backend string, delivered, routingLoss, indexLoss, workloadMiss int) {
	s := m.reuse.backend(backend)
	for i, n := range [...]int{delivered, routingLoss, indexLoss, workloadMiss} {
		if n > 0 {
			s[i].Add(float64(n))
		}
	}
}

// backend returns backend's counters, by kind.
func (r *reuseMetrics) backend(backend string) *[len(reuseKinds)]prometheus.Counter {
	if s, ok := r.series.Load(backend); ok {
		return s.(*[len(reuseKinds)]prometheus.Counter)
	}
	var s [len(reuseKinds)]prometheus.Counter
	for i, kind := range reuseKinds {
		s[i] = r.tokens.WithLabelValues(backend, kind)
	}
	got, _ := r.series.LoadOrStore(backend, &s)
	return got.(*[len(reuseKinds)]prometheus.Counter)
}

// BestOverlap counts a keyed decision that chose a candidate believed to
// hold the longest match.
func (m *Metrics) BestOverlap(best bool) {
	if best {
		m.reuse.bestOverlap.Inc()
	}
}
