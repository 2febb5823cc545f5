package telemetry

import "github.com/prometheus/client_golang/prometheus"

// PreciseStats is what precise mode counted: the renders of exact tokens
// and, by replica, what is followed of its engine's KV events.
type PreciseStats struct {
	// Renders by result: rendered, tokenized, cache_hit, pass_through,
	// prefix, late, background_failed, background_skipped.
	Renders map[string]uint64
	// Fallbacks (routed on the approximate key) by reason: timeout,
	// not_served, unkeyed, error.
	Fallbacks map[string]uint64
	// RenderP99 is the 99th percentile of a render's wait, in seconds.
	RenderP99 float64
	// Replicas are the followed replicas' event states.
	Replicas []PreciseReplica
}

// PreciseReplica is one replica's event state.
type PreciseReplica struct {
	Name                    string
	Precise                 bool
	LagSeconds              float64
	Gaps, Replays, Resets   uint64
	Stored, Removed, Blocks uint64
	// Rejected counts, by reason, the KV-event connections closed and
	// messages left out for what the replica's side sent.
	Rejected map[string]uint64
	// LeftOut counts the blocks of well-formed events that were not
	// applied, by reason: unplaceable (a stored block whose parent is
	// unknown), skipped (not indexed: another cache group, a span not
	// whole blocks), unknown_removed (a removal of a block not kept).
	LeftOut map[string]uint64
}

// AddPrecise registers precise mode's metrics, reading src at scrape time.
func (m *Metrics) AddPrecise(src func() PreciseStats) {
	m.Registry.MustRegister(&preciseCollector{src: src})
}

type preciseCollector struct{ src func() PreciseStats }

var (
	descRenders      = prometheus.NewDesc("kvroute_precise_renders_total", "Exact-token renders by result (rendered, tokenized: /tokenize stood in, cache_hit, pass_through: token-id prompts, prefix: a next turn keyed on its previous turn's render while it renders in the background, late: a render that answered after its request's deadline, cached for the next turn, background_failed: such a background render failed, background_skipped: a prefix answer that made no background render, the renderer being behind).", []string{"result"}, nil)
	descFallbacks    = prometheus.NewDesc("kvroute_precise_fallbacks_total", "Requests routed on the approximate key because their render failed, by reason (timeout, not_served, unkeyed, error).", []string{labelReason}, nil)
	descRenderP99    = prometheus.NewDesc("kvroute_precise_render_seconds_p99", "99th percentile of a render's wait since start, in seconds.", nil, nil)
	descPreciseOn    = prometheus.NewDesc("kvroute_backend_precise", "1 while the replica's Index entries follow its engine's KV events (precise), 0 while approximate.", []string{labelBackend}, nil)
	descEventLag     = prometheus.NewDesc("kvroute_kv_events_lag_seconds", "How far behind the engine's timestamp its last KV-event batch was applied.", []string{labelBackend}, nil)
	descEventGaps    = prometheus.NewDesc("kvroute_kv_events_gaps_total", "Sequence gaps in the replica's KV-event stream.", []string{labelBackend}, nil)
	descEventReplays = prometheus.NewDesc("kvroute_kv_events_replays_total", "Replays asked of the replica's engine to fill gaps.", []string{labelBackend}, nil)
	descEventResets  = prometheus.NewDesc("kvroute_kv_events_resets_total", "Times the replica's precise state was dropped (missed events no replay gave back, an engine restart) and rebuilt.", []string{labelBackend}, nil)
	descEventBlocks  = prometheus.NewDesc("kvroute_kv_events_blocks_total", "Engine blocks applied from KV events, by event (stored, removed).", []string{labelBackend, "event"}, nil)
	descEventHeld    = prometheus.NewDesc("kvroute_kv_events_blocks", "Engine blocks the replica's events say it holds now.", []string{labelBackend}, nil)
	descEventLeftOut = prometheus.NewDesc("kvroute_kv_events_left_out_total", "Blocks of the replica's well-formed KV events that were not applied, by reason (unplaceable: a stored block whose parent block is unknown; skipped: not indexed, of another cache group or a span not whole blocks; unknown_removed: a removal of a block not kept). A stream whose stored blocks are all unplaceable places nothing.", []string{labelBackend, labelReason}, nil)
	descEventReject  = prometheus.NewDesc("kvroute_kv_events_rejected_total", "KV-event connections closed and messages left out for what the replica's side sent, by reason (frame_too_large, message_too_large: past precise.max_event_bytes; bad_framing: not ZMTP; malformed: not [topic, sequence, payload]; undecodable: not an event batch; decode_too_large: a batch decoding past 4 × precise.max_event_bytes; peer_refused: a connection to a kv_events.listen socket from an address not allowed, or without a handshake within 5 s).", []string{labelBackend, "reason"}, nil)
)

func (c *preciseCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRenders, descFallbacks, descRenderP99, descPreciseOn, descEventLag,
		descEventGaps, descEventReplays, descEventResets, descEventBlocks, descEventHeld, descEventReject, descEventLeftOut} {
		ch <- d
	}
}

func (c *preciseCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src()
	for k, v := range st.Renders {
		ch <- prometheus.MustNewConstMetric(descRenders, prometheus.CounterValue, float64(v), k)
	}
	for k, v := range st.Fallbacks {
		ch <- prometheus.MustNewConstMetric(descFallbacks, prometheus.CounterValue, float64(v), k)
	}
	ch <- prometheus.MustNewConstMetric(descRenderP99, prometheus.GaugeValue, st.RenderP99)
	for _, r := range st.Replicas {
		on := 0.0
		if r.Precise {
			on = 1
		}
		ch <- prometheus.MustNewConstMetric(descPreciseOn, prometheus.GaugeValue, on, r.Name)
		ch <- prometheus.MustNewConstMetric(descEventLag, prometheus.GaugeValue, r.LagSeconds, r.Name)
		ch <- prometheus.MustNewConstMetric(descEventGaps, prometheus.CounterValue, float64(r.Gaps), r.Name)
		ch <- prometheus.MustNewConstMetric(descEventReplays, prometheus.CounterValue, float64(r.Replays), r.Name)
		ch <- prometheus.MustNewConstMetric(descEventResets, prometheus.CounterValue, float64(r.Resets), r.Name)
		ch <- prometheus.MustNewConstMetric(descEventBlocks, prometheus.CounterValue, float64(r.Stored), r.Name, "stored")
		ch <- prometheus.MustNewConstMetric(descEventBlocks, prometheus.CounterValue, float64(r.Removed), r.Name, "removed")
		ch <- prometheus.MustNewConstMetric(descEventHeld, prometheus.GaugeValue, float64(r.Blocks), r.Name)
		for reason, n := range r.Rejected {
			ch <- prometheus.MustNewConstMetric(descEventReject, prometheus.CounterValue, float64(n), r.Name, reason)
		}
		for reason, n := range r.LeftOut {
			ch <- prometheus.MustNewConstMetric(descEventLeftOut, prometheus.CounterValue, float64(n), r.Name, reason)
		}
	}
}

// RoutingState is a replica's routing state: exact, approximate or
// degraded, with its reason (a bounded set).
type RoutingState struct{ Backend, State, Reason string }

var descRoutingState = prometheus.NewDesc("kvroute_backend_routing_state",
	"1 for the replica's routing state: exact (its engine's KV events followed and renders served), approximate (reason configured: no kv_events or precise mode off), "+
		"or degraded (precise mode asked for and not had; reason render_not_served, render_failing, events_disconnected, events_rejected, events_unplaceable, events_silent, events_waiting), routed on the approximate key.",
	[]string{labelBackend, "state", "reason"}, nil)

// AddRoutingStates registers kvroute_backend_routing_state, reading src
// at scrape time.
func (m *Metrics) AddRoutingStates(src func() []RoutingState) {
	m.Registry.MustRegister(routingStateCollector(src))
}

type routingStateCollector func() []RoutingState

func (c routingStateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descRoutingState }

func (c routingStateCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c() {
		ch <- prometheus.MustNewConstMetric(descRoutingState, prometheus.GaugeValue, 1, st.Backend, st.State, st.Reason)
	}
}
