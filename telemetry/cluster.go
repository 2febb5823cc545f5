package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ClusterStats are the counters of this instance's cluster member: the
// cluster package's Node.Stats returns them (cluster.Stats is this type).
type ClusterStats struct {
	// Messages and bytes published (batches and resync chunks) and
	// received from peers.
	SentMessages, SentBytes         uint64
	ReceivedMessages, ReceivedBytes uint64
	// Records is the records published in live batches.
	Records uint64
	// Peers is the number of instances heard from within three load
	// intervals (at least 2s).
	Peers int
	// Connected: NATS is reachable and, when peers are configured, at
	// least one route to them is up.
	Connected bool
	// Gaps: live batches whose sequence showed missed messages (or a
	// restarted peer). Resyncs: resyncs asked of peers; Replays: resyncs
	// answered.
	Gaps, Resyncs, Replays uint64
	// Dropped: batches that could not be published (NATS refused them);
	// Malformed: batches from peers that did not decode; Unknown: records
	// naming a replica this instance does not have.
	Dropped, Malformed, Unknown uint64
	// JournalBytes is the journal's size.
	JournalBytes int64
	// Leading: this instance chooses the replica of the cluster's requests
	// placed on load (cluster/lead.go).
	Leading bool
	// LeadAsked: requests placed on load whose replica this instance asked
	// the leader for; LeadMissed: of those, the ones not answered within
	// cluster.lead_timeout (chosen alone); LeadAlone: ones chosen alone
	// without asking (lead_timeout 0, or the leader just unreachable).
	LeadAsked, LeadMissed, LeadAlone uint64
	// LeadServed: asks this instance answered as the leader; LeadLapsed:
	// its reservations no placement came to release within a second.
	LeadServed, LeadLapsed uint64
	// Rejected counts, by reason (cluster.RejectReasons, a fixed set),
	// what this instance refused or cut of what peers and non-members sent.
	Rejected map[string]uint64
}

// AddCluster registers the cluster's metrics, reading src at scrape time.
func (m *Metrics) AddCluster(src func() ClusterStats) {
	m.Registry.MustRegister(&clusterCollector{src: src})
}

type clusterCollector struct{ src func() ClusterStats }

// clusterMetric is one metric of ClusterStats.
type clusterMetric struct {
	desc  *prometheus.Desc
	typ   prometheus.ValueType
	value func(*ClusterStats) float64
}

func clusterDesc(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }

var clusterMetrics = []clusterMetric{
	{clusterDesc("kvroute_cluster_sent_messages_total", "Messages (batches and resync chunks) this instance published to its peers."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.SentMessages) }},
	{clusterDesc("kvroute_cluster_sent_bytes_total", "Bytes of the messages this instance published to its peers."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.SentBytes) }},
	{clusterDesc("kvroute_cluster_received_messages_total", "Messages received from peers."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.ReceivedMessages) }},
	{clusterDesc("kvroute_cluster_received_bytes_total", "Bytes of the messages received from peers."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.ReceivedBytes) }},
	{clusterDesc("kvroute_cluster_records_total", "Records (placements, lifecycle, load, sessions, response ids) published in live batches."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Records) }},
	{clusterDesc("kvroute_cluster_peers", "Peers heard from within three load intervals."), prometheus.GaugeValue,
		func(s *ClusterStats) float64 { return float64(s.Peers) }},
	{clusterDesc("kvroute_cluster_connected", "1 while NATS and, when peers are configured, a route to them are up; 0 while this instance routes on its own view."), prometheus.GaugeValue,
		func(s *ClusterStats) float64 { return b2f(s.Connected) }},
	{clusterDesc("kvroute_cluster_gaps_total", "Live batches from peers whose sequence showed missed messages or a restart."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Gaps) }},
	{clusterDesc("kvroute_cluster_resyncs_total", "Resyncs this instance asked of its peers."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Resyncs) }},
	{clusterDesc("kvroute_cluster_replays_total", "Resyncs this instance answered from its journal."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Replays) }},
	{clusterDesc("kvroute_cluster_dropped_total", "Batches NATS refused to publish (their sequence numbers are spent: peers resync)."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Dropped) }},
	{clusterDesc("kvroute_cluster_malformed_total", "Messages from peers that did not decode (another format version, or damaged)."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Malformed) }},
	{clusterDesc("kvroute_cluster_unknown_replica_total", "Peer records naming a replica this instance does not have (backend lists differ)."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.Unknown) }},
	{clusterDesc("kvroute_cluster_journal_bytes", "Bytes of this instance's own recent records kept to resync peers (cluster.journal_bytes bounds them)."), prometheus.GaugeValue,
		func(s *ClusterStats) float64 { return float64(s.JournalBytes) }},
	{clusterDesc("kvroute_cluster_leading", "1 while this instance is the cluster's leader, which chooses the replica of requests placed on load (cold, or a new branch of a shared prefix)."), prometheus.GaugeValue,
		func(s *ClusterStats) float64 { return b2f(s.Leading) }},
	{clusterDesc("kvroute_cluster_lead_asked_total", "Requests placed on load whose replica this instance asked the leader for."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.LeadAsked) }},
	{clusterDesc("kvroute_cluster_lead_missed_total", "Asks to the leader not answered within cluster.lead_timeout; the replica was chosen on this instance's own view."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.LeadMissed) }},
	{clusterDesc("kvroute_cluster_lead_alone_total", "Requests placed on load chosen on this instance's own view without asking (lead_timeout 0, or the leader just unreachable)."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.LeadAlone) }},
	{clusterDesc("kvroute_cluster_lead_served_total", "Asks this instance answered as the leader."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.LeadServed) }},
	{clusterDesc("kvroute_cluster_lead_lapsed_total", "Reservations this instance made as the leader that no placement released within a second."), prometheus.CounterValue,
		func(s *ClusterStats) float64 { return float64(s.LeadLapsed) }},
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var descClusterRejected = prometheus.NewDesc("kvroute_cluster_rejected_total",
	"Messages and claims the cluster member refused or cut, by reason: unauthenticated (not sealed by a member), malformed, "+
		"max_peers (a new peer past cluster.max_peers), replayed, placements (a peer's oldest dropped past cluster.max_peer_placement_bytes), "+
		"load (the peers' claimed load cut to what the engine reports), resync_busy, resync_size.",
	[]string{labelReason}, nil)

// labelReason is the label of a count by reason (kvroute_cluster_rejected_total, kvroute_flow_refused_total, kvroute_precise_fallbacks_total).
const labelReason = "reason"

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range clusterMetrics {
		ch <- m.desc
	}
	ch <- descClusterRejected
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src()
	for _, m := range clusterMetrics {
		ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(&st))
	}
	for reason, n := range st.Rejected {
		ch <- prometheus.MustNewConstMetric(descClusterRejected, prometheus.CounterValue, float64(n), reason)
	}
}

// LagHistogram is a distribution of durations: Buckets[i] counts those at
// most Bounds[i] (not cumulative), a last bucket those above; Count and
// Sum over all of them.
type LagHistogram struct {
	Bounds  []time.Duration
	Buckets []uint64
	Count   uint64
	Sum     time.Duration
}

var descPlacementLag = prometheus.NewDesc("kvroute_cluster_placement_lag_seconds",
	"Time from a peer's placement (by its clock) to this instance applying it to its index.", nil, nil)

// AddClusterLag registers kvroute_cluster_placement_lag_seconds, reading
// src at scrape time.
func (m *Metrics) AddClusterLag(src func() LagHistogram) {
	m.Registry.MustRegister(lagCollector(src))
}

type lagCollector func() LagHistogram

func (c lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descPlacementLag }

func (c lagCollector) Collect(ch chan<- prometheus.Metric) {
	h := c()
	cum := make(map[float64]uint64, len(h.Bounds))
	var seen uint64
	for i, b := range h.Bounds {
		if i < len(h.Buckets) {
			seen += h.Buckets[i]
		}
		cum[b.Seconds()] = seen
	}
	ch <- prometheus.MustNewConstHistogram(descPlacementLag, h.Count, h.Sum.Seconds(), cum)
}
