package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FlowRefusals are the reasons flow control refuses a request (the reason
// label of kvroute_flow_refused_total): a tenant limit, or the queue.
var FlowRefusals = []string{"rate", "concurrency", "tokens", "queue_full", "shed", "queue_timeout"}

// FlowBands are the priority bands of kvroute_flow_wait_seconds: below 0,
// 0, above 0.
var FlowBands = []string{"high", "normal", "low"}

// flowSeries are flow control's series.
type flowSeries struct {
	refused *prometheus.CounterVec
	waited  *prometheus.HistogramVec
}

func newFlowSeries() flowSeries {
	f := flowSeries{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_flow_refused_total",
			Help: "Requests flow control refused, by reason: a tenant limit (rate, concurrency, tokens) or kvroute's queue (queue_full, shed, queue_timeout).",
		}, []string{labelReason}),
		waited: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_flow_wait_seconds",
			Help:    "Time dispatched requests waited in kvroute's queue while every replica was saturated, by priority band (high < 0, normal 0, low > 0).",
			Buckets: LatencyBuckets,
		}, []string{"band"}),
	}
	for _, r := range FlowRefusals {
		f.refused.WithLabelValues(r)
	}
	for _, b := range FlowBands {
		f.waited.WithLabelValues(b)
	}
	return f
}

// FlowRefused counts a request refused by flow control.
func (m *Metrics) FlowRefused(reason string) { m.flow.refused.WithLabelValues(reason).Inc() }

// FlowWaited records a dispatched request's wait in the queue.
func (m *Metrics) FlowWaited(band string, d time.Duration) {
	m.flow.waited.WithLabelValues(band).Observe(d.Seconds())
}

// WatchFlowQueue exports what waits in kvroute's queue, read by queue at
// scrape time: kvroute_flow_queued_requests and kvroute_flow_queued_bytes.
func (m *Metrics) WatchFlowQueue(queue func() (requests int, bytes int64)) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvroute_flow_queued_requests",
			Help: "Requests waiting in kvroute's queue while every replica that could serve them is saturated.",
		}, func() float64 { n, _ := queue(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvroute_flow_queued_bytes",
			Help: "Bytes of the request bodies waiting in kvroute's queue.",
		}, func() float64 { _, b := queue(); return float64(b) }),
	)
}
