// Package telemetry exposes kvroute's own Prometheus metrics, all named
// kvroute_*, on a registry of its own. Per-replica series carry a
// backend="<name>" label.
package telemetry

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/tokenize"
)

// Metrics holds the router's metrics. Its methods are safe for concurrent
// use and cheap enough for the request path.
type Metrics struct {
	Registry *prometheus.Registry

	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	ttfb         *prometheus.HistogramVec
	decision     prometheus.Histogram
	matched      prometheus.Histogram
	matchedTotal prometheus.Counter
	keyTotal     prometheus.Counter
	// cached holds the engines' cached-token reports by the decision's
	// mode: approximate (0), precise (1).
	cached        [2]cachedSeries
	retries       *prometheus.CounterVec
	reuse         *reuseMetrics
	writeTimeouts *prometheus.CounterVec
	polledStreams *prometheus.CounterVec
	reloads       *prometheus.CounterVec
	flow          flowSeries

	// series caches the children of requests, duration and ttfb by label
	// values, so counting a request does not hash its labels again.
	seriesMu sync.RWMutex
	series   map[requestKey]*requestSeries
}

// requestKey is one request's label values; route is already reduced by
// RouteLabel.
type requestKey struct {
	endpoint, backend, route string
	status                   int
}

type requestSeries struct {
	count    prometheus.Counter
	duration prometheus.Observer
	ttfb     prometheus.Observer
}

// Endpoints are the endpoint label values the proxy uses: the routed
// OpenAI and SGLang paths, /v1/models, and "other" for anything else.
var Endpoints = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/generate", "/v1/models", "other"}

// SelfWritten are the statuses kvroute answers itself, before or instead
// of reaching a replica; kvroute_requests_total starts at zero for each of
// them on every endpoint (with no backend and no route).
var SelfWritten = []int{400, 401, 408, 413, 414, 431, 499, 503}

// LatencyBuckets are the upper bounds, in seconds, of the request duration
// and time-to-first-byte histograms: from 5 ms (an answer kvroute writes
// itself, a cached embedding) to 10 minutes (a long generation).
var LatencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600}

// Label names shared by several metrics: the endpoint, the replica's
// backend name, and the kind of token cache entry.
const (
	labelEndpoint = "endpoint"
	labelBackend  = "backend"
	labelKind     = "kind"
)

// Fleet is what the replica collector reads at scrape time.
type Fleet interface {
	Replicas() []*backends.Replica
}

// TreeStats is what the prefix tree collector reports: the tree's size,
// and the tokens it records each replica as holding, by replica ID, in its
// approximate share (Held) and its exact one (HeldExact, precise mode).
// The index package's Index.Stats returns it (index.Stats is this
// type).
type TreeStats struct {
	Nodes           int
	Tokens, Bytes   int64
	Held, HeldExact map[int]int64
}

// TreeSource gives the prefix tree's statistics to report; false when the
// policy keeps no tree.
type TreeSource func() (TreeStats, bool)

// New builds the metrics and registers collectors reading fleet and tree at
// scrape time.
func New(fleet Fleet, tree TreeSource) *Metrics {
	m := &Metrics{Registry: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_requests_total",
		Help: "Requests answered, by endpoint, replica (empty when none was reached), status code and route reason.",
	}, []string{labelEndpoint, labelBackend, "status", "route"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvroute_request_duration_seconds",
		Help:    "Time from a request's arrival to the end of its answer, by endpoint, replica (empty when none was reached) and status class (2xx, 4xx, 5xx).",
		Buckets: LatencyBuckets,
	}, []string{labelEndpoint, labelBackend, "status_class"})
	m.ttfb = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvroute_time_to_first_byte_seconds",
		Help: "Time from a request's arrival to the first byte of its answer's body: the first streamed event (time to first token) " +
			"or a whole buffered answer; by endpoint, replica and status class. Answers that sent no body byte are not observed.",
		Buckets: LatencyBuckets,
	}, []string{labelEndpoint, labelBackend, "status_class"})
	m.decision = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvroute_routing_decision_seconds",
		Help:    "Time to choose a replica: tokenization, match, score and record.",
		Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 12),
	})
	m.matched = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "kvroute_matched_tokens",
		Help:    "Prompt tokens the chosen replica was believed to hold, per routed request.",
		Buckets: prometheus.ExponentialBuckets(16, 4, 9),
	})
	m.matchedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvroute_matched_tokens_total",
		Help: "Sum of matched prompt tokens; divided by kvroute_key_tokens_total it is the estimated prefix-hit ratio.",
	})
	m.keyTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvroute_key_tokens_total",
		Help: "Sum of routing-key tokens of routed requests.",
	})
	predictedCached := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_predicted_cached_tokens_total",
		Help: "Matched tokens of requests whose engine reported cached tokens (compare with kvroute_engine_cached_tokens_total), by the decision's mode (precise: on the engine's own tokens; approximate).",
	}, cachedLabels)
	reportedCached := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_engine_cached_tokens_total",
		Help: "Cached prompt tokens engines reported in usage.prompt_tokens_details.cached_tokens, by the decision's mode.",
	}, cachedLabels)
	cachedPrompt := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_engine_prompt_tokens_total",
		Help: "Prompt tokens engines reported in usage.prompt_tokens, for requests that reported cached tokens, by the decision's mode.",
	}, cachedLabels)
	for i, mode := range [...]string{"approximate", "precise"} {
		m.cached[i] = cachedSeries{
			predicted: predictedCached.WithLabelValues(mode),
			reported:  reportedCached.WithLabelValues(mode),
			prompt:    cachedPrompt.WithLabelValues(mode),
		}
	}
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_retries_total",
		Help: "Attempts that failed before any response byte and were retried elsewhere, by the replica that failed.",
	}, []string{labelBackend})
	m.writeTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_client_write_timeouts_total",
		Help: "Answers ended because the client took longer than timeouts.client_write to accept bytes, by the replica that answered.",
	}, []string{labelBackend})
	m.polledStreams = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_streams_polled_total",
		Help: "Event streams whose replica body was relayed by a Poller (plain TCP on both sides), by the replica that answered.",
	}, []string{labelBackend})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_config_reloads_total",
		Help: "Configuration reloads by result (ok, rejected).",
	}, []string{"result"})
	m.flow = newFlowSeries()
	m.series = map[requestKey]*requestSeries{}
	for _, e := range Endpoints {
		for _, st := range SelfWritten {
			m.requests.WithLabelValues(e, "", statusText(st), "")
		}
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("rejected")
	m.reuse = newReuseMetrics()
	m.Registry.MustRegister(m.requests, m.duration, m.ttfb, m.decision, m.matched, m.matchedTotal, m.keyTotal,
		m.reuse.tokens, m.reuse.bestOverlap,
		predictedCached, reportedCached, cachedPrompt, &perBackend{vec: m.retries, fleet: fleet},
		&perBackend{vec: m.writeTimeouts, fleet: fleet}, &perBackend{vec: m.polledStreams, fleet: fleet}, m.reloads,
		m.flow.refused, m.flow.waited,
		&fleetCollector{fleet: fleet}, &treeCollector{tree: tree, fleet: fleet},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// perBackend is a counter vector by backend whose series exist, at zero,
// for every replica in the fleet from the first scrape on, replicas added
// later by reload or discovery included.
type perBackend struct {
	vec   *prometheus.CounterVec
	fleet Fleet
}

func (c *perBackend) Describe(ch chan<- *prometheus.Desc) { c.vec.Describe(ch) }

func (c *perBackend) Collect(ch chan<- prometheus.Metric) {
	if c.fleet != nil {
		for _, r := range c.fleet.Replicas() {
			c.vec.WithLabelValues(r.Name())
		}
	}
	c.vec.Collect(ch)
}

// RouteLabel reduces a route reason to its low-cardinality kind:
// "cache_hit matched=1536" → "cache_hit", "cold least_load" → "cold".
func RouteLabel(reason string) string {
	if i := strings.IndexByte(reason, ' '); i >= 0 {
		return reason[:i]
	}
	return reason
}

// Request counts one answered request and observes its duration and, when
// its answer sent a body byte (ttfb > 0), its time to first byte. After the
// first request with the same labels it neither allocates nor hashes them.
func (m *Metrics) Request(endpoint, backend string, status int, route string, ttfb, total time.Duration) {
	s := m.requestSeries(requestKey{endpoint: endpoint, backend: backend, route: RouteLabel(route), status: status})
	s.count.Inc()
	s.duration.Observe(total.Seconds())
	if ttfb > 0 {
		s.ttfb.Observe(ttfb.Seconds())
	}
}

func (m *Metrics) requestSeries(k requestKey) *requestSeries {
	m.seriesMu.RLock()
	s := m.series[k]
	m.seriesMu.RUnlock()
	if s != nil {
		return s
	}
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	if s = m.series[k]; s != nil {
		return s
	}
	// The key's strings may alias a request's buffers: keep copies.
	k.endpoint, k.backend, k.route = strings.Clone(k.endpoint), strings.Clone(k.backend), strings.Clone(k.route)
	class := StatusClass(k.status)
	s = &requestSeries{
		count:    m.requests.WithLabelValues(k.endpoint, k.backend, statusText(k.status), k.route),
		duration: m.duration.WithLabelValues(k.endpoint, k.backend, class),
		ttfb:     m.ttfb.WithLabelValues(k.endpoint, k.backend, class),
	}
	m.series[k] = s
	return s
}

// StatusClass is the status_class label of an HTTP status: "2xx", "4xx",
// "5xx" and so on; "unknown" outside 100–599.
func StatusClass(status int) string {
	if status < 100 || status > 599 {
		return "unknown"
	}
	return statusClasses[status/100-1]
}

var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx"}

// Decision records one routing decision.
func (m *Metrics) Decision(d time.Duration, matched, keyTokens int) {
	m.decision.Observe(d.Seconds())
	if keyTokens > 0 {
		m.matched.Observe(float64(matched))
		m.matchedTotal.Add(float64(matched))
		m.keyTotal.Add(float64(keyTokens))
	}
}

// cachedLabels label the engines' cached-token reports by the decision's
// mode: precise or approximate.
var cachedLabels = []string{"mode"}

// cachedSeries is one mode's series of the engines' cached-token reports.
type cachedSeries struct{ predicted, reported, prompt prometheus.Counter }

// Cached records an engine's report of cached tokens next to the
// prediction, by whether the decision was made on the engine's own tokens.
func (m *Metrics) Cached(predicted, reported, prompt int, precise bool) {
	s := &m.cached[0]
	if precise {
		s = &m.cached[1]
	}
	s.predicted.Add(float64(predicted))
	s.reported.Add(float64(reported))
	s.prompt.Add(float64(prompt))
}

// CachedTokens returns the sums of predicted and engine-reported cached
// tokens over the requests whose engine reported them, both modes: the
// second over the first is the routing's precision.
func (m *Metrics) CachedTokens() (predicted, reported int64) {
	for i := range m.cached {
		predicted += counterValue(m.cached[i].predicted)
		reported += counterValue(m.cached[i].reported)
	}
	return predicted, reported
}

// counterValue reads c's current value.
func counterValue(c prometheus.Counter) int64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return int64(d.GetCounter().GetValue())
}

// Retry counts a failed attempt that was retried.
func (m *Metrics) Retry(backend string) { m.retries.WithLabelValues(backend).Inc() }

// ClientWriteTimeout counts an answer cut by timeouts.client_write.
func (m *Metrics) ClientWriteTimeout(_, backend string) {
	m.writeTimeouts.WithLabelValues(backend).Inc()
}

// PolledStream counts an event stream relayed by a Poller.
func (m *Metrics) PolledStream(backend string) { m.polledStreams.WithLabelValues(backend).Inc() }

// Reload counts a configuration reload; ok false means it was rejected.
func (m *Metrics) Reload(ok bool) {
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("rejected").Inc()
	}
}

var statusTexts = func() map[int]string {
	m := map[int]string{}
	for s := 100; s < 600; s++ {
		m[s] = itoa(s)
	}
	return m
}()

func statusText(s int) string {
	if t, ok := statusTexts[s]; ok {
		return t
	}
	return itoa(s)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [12]byte
	i := len(b)
	neg := n < 0
	if neg {
		n = -n
	}
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

// fleetCollector reports each replica's state at scrape time.
type fleetCollector struct{ fleet Fleet }

var (
	descHealthy   = prometheus.NewDesc("kvroute_backend_healthy", "1 when the replica is in service, 0 when ejected.", []string{labelBackend}, nil)
	descInFlight  = prometheus.NewDesc("kvroute_backend_in_flight", "Requests in flight through kvroute to the replica.", []string{labelBackend}, nil)
	descStaleness = prometheus.NewDesc("kvroute_backend_metrics_age_seconds", "Age of the replica's last metrics snapshot; -1 when none.", []string{labelBackend}, nil)
	descEjections = prometheus.NewDesc("kvroute_backend_ejections_total", "Times the replica was ejected.", []string{labelBackend}, nil)
	descWaiting   = prometheus.NewDesc("kvroute_backend_waiting", "Waiting requests in the replica's last metrics snapshot.", []string{labelBackend}, nil)
	descKVUsage   = prometheus.NewDesc("kvroute_backend_kv_usage", "KV cache usage 0–1 in the replica's last metrics snapshot.", []string{labelBackend}, nil)
	descRole      = prometheus.NewDesc("kvroute_backend_role", "1 for the replica's role in a disaggregated fleet: prefill, decode or both.", []string{labelBackend, "role"}, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHealthy, descInFlight, descStaleness, descEjections, descWaiting, descKVUsage, descRole} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, r := range c.fleet.Replicas() {
		name := r.Name()
		healthy := 0.0
		if r.Healthy() {
			healthy = 1
		}
		ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, healthy, name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(r.InFlight()), name)
		ch <- prometheus.MustNewConstMetric(descEjections, prometheus.CounterValue, float64(r.Ejections()), name)
		ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, 1, name, string(r.Role()))
		age := -1.0
		if s := r.Snapshot(); s != nil {
			age = now.Sub(s.At).Seconds()
			ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, s.Waiting, name)
			ch <- prometheus.MustNewConstMetric(descKVUsage, prometheus.GaugeValue, s.KVUsage, name)
		}
		ch <- prometheus.MustNewConstMetric(descStaleness, prometheus.GaugeValue, age, name)
	}
}

// treeCollector reports the prefix tree's size at scrape time, and what it
// records each replica as holding by the replica's name.
type treeCollector struct {
	tree  TreeSource
	fleet Fleet
}

var (
	descTreeTokens    = prometheus.NewDesc("kvroute_tree_tokens", "Prompt tokens the prefix tree stores, in whole key blocks (its key values × tokens per value).", nil, nil)
	descTreeNodes     = prometheus.NewDesc("kvroute_tree_nodes", "Nodes in the prefix tree.", nil, nil)
	descTreeBytes     = prometheus.NewDesc("kvroute_tree_bytes", "Estimated memory of the prefix tree in bytes.", nil, nil)
	descTreeHeld      = prometheus.NewDesc("kvroute_tree_held_tokens", "Tokens the tree records a replica as holding, by replica: its approximate share, keyed by kvroute's own tokens.", []string{labelBackend}, nil)
	descTreeHeldExact = prometheus.NewDesc("kvroute_tree_held_exact_tokens", "Tokens the tree records a replica as holding in its exact share (precise mode: keyed by its engine's own tokens), by replica.", []string{labelBackend}, nil)
)

func (c *treeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTreeTokens
	ch <- descTreeNodes
	ch <- descTreeBytes
	ch <- descTreeHeld
	ch <- descTreeHeldExact
}

func (c *treeCollector) Collect(ch chan<- prometheus.Metric) {
	if c.tree == nil {
		return
	}
	s, ok := c.tree()
	if !ok {
		return
	}
	ch <- prometheus.MustNewConstMetric(descTreeTokens, prometheus.GaugeValue, float64(s.Tokens))
	ch <- prometheus.MustNewConstMetric(descTreeNodes, prometheus.GaugeValue, float64(s.Nodes))
	ch <- prometheus.MustNewConstMetric(descTreeBytes, prometheus.GaugeValue, float64(s.Bytes))
	if c.fleet == nil {
		return
	}
	// A replica that left the fleet has its entries dropped; until then
	// they have no name to report.
	for _, r := range c.fleet.Replicas() {
		if held, ok := s.Held[r.ID()]; ok {
			ch <- prometheus.MustNewConstMetric(descTreeHeld, prometheus.GaugeValue, float64(held), r.Name())
		}
		if held, ok := s.HeldExact[r.ID()]; ok {
			ch <- prometheus.MustNewConstMetric(descTreeHeldExact, prometheus.GaugeValue, float64(held), r.Name())
		}
	}
}

// TokenCacheSource gives the token cache's counters at scrape time.
type TokenCacheSource func() tokenize.CacheStats

// AddTokenCache registers a collector reporting the routing-key token
// cache from src: hits, misses, entries and bytes by kind of entry
// (message, chunk, conversation) and the cache's bound.
func (m *Metrics) AddTokenCache(src TokenCacheSource) {
	m.Registry.MustRegister(&tokenCacheCollector{src: src})
}

type tokenCacheCollector struct{ src TokenCacheSource }

var (
	descTokHits    = prometheus.NewDesc("kvroute_token_cache_hits_total", "Token cache lookups that found their text, by kind of entry.", []string{labelKind}, nil)
	descTokMisses  = prometheus.NewDesc("kvroute_token_cache_misses_total", "Token cache lookups that did not find their text, by kind of entry.", []string{labelKind}, nil)
	descTokEntries = prometheus.NewDesc("kvroute_token_cache_entries", "Entries in the token cache, by kind.", []string{labelKind}, nil)
	descTokBytes   = prometheus.NewDesc("kvroute_token_cache_bytes", "Estimated memory of the token cache's entries in bytes, by kind.", []string{labelKind}, nil)
	descTokMax     = prometheus.NewDesc("kvroute_token_cache_max_bytes", "Bound on the token cache's estimated memory in bytes (tokenizer.cache_bytes).", nil, nil)
)

func (c *tokenCacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descTokHits, descTokMisses, descTokEntries, descTokBytes, descTokMax} {
		ch <- d
	}
}

func (c *tokenCacheCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src()
	for _, k := range []struct {
		kind string
		c    tokenize.CacheCounters
	}{{"message", st.Messages}, {"chunk", st.Chunks}, {"conversation", st.Conversations}} {
		ch <- prometheus.MustNewConstMetric(descTokHits, prometheus.CounterValue, float64(k.c.Hits), k.kind)
		ch <- prometheus.MustNewConstMetric(descTokMisses, prometheus.CounterValue, float64(k.c.Misses), k.kind)
		ch <- prometheus.MustNewConstMetric(descTokEntries, prometheus.GaugeValue, float64(k.c.Entries), k.kind)
		ch <- prometheus.MustNewConstMetric(descTokBytes, prometheus.GaugeValue, float64(k.c.Bytes), k.kind)
	}
	ch <- prometheus.MustNewConstMetric(descTokMax, prometheus.GaugeValue, float64(st.Messages.MaxBytes))
}

// SessionStats describes a session table: the router package's
// Sessions.Stats returns it (router.SessionStats is this type).
type SessionStats struct {
	Entries    int   // bindings held, expired ones not yet dropped included
	MaxEntries int   // the entry bound
	Rejected   int64 // IDs rejected for their length, since the table was built
	Evicted    int64 // bindings dropped for the entry bound, since the table was built
}

// AddSessions registers a collector reporting the session table from src:
// bindings held, the entry bound, IDs rejected for their length and
// bindings evicted for the bound.
func (m *Metrics) AddSessions(src func() SessionStats) {
	m.Registry.MustRegister(&statsCollector[SessionStats]{src: src, stats: sessionStats})
}

// sessionStats are the session table's metrics.
var sessionStats = []stat[SessionStats]{
	{prometheus.NewDesc("kvroute_sessions", "Session bindings held in the session table.", nil, nil),
		prometheus.GaugeValue, func(s SessionStats) int64 { return int64(s.Entries) }},
	{prometheus.NewDesc("kvroute_sessions_max_entries", "Bound on the session table's bindings (session.max_entries).", nil, nil),
		prometheus.GaugeValue, func(s SessionStats) int64 { return int64(s.MaxEntries) }},
	{prometheus.NewDesc("kvroute_session_ids_rejected_total", "Session IDs longer than session.max_id_bytes, routed as requests without a session.", nil, nil),
		prometheus.CounterValue, func(s SessionStats) int64 { return s.Rejected }},
	{prometheus.NewDesc("kvroute_sessions_evicted_total", "Session bindings dropped, least recently used first, to stay within session.max_entries.", nil, nil),
		prometheus.CounterValue, func(s SessionStats) int64 { return s.Evicted }},
}

// stat is one metric a statsCollector reports: its description, its kind
// and its value in a snapshot of S.
type stat[S any] struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(S) int64
}

// statsCollector reports, at scrape time, each of stats from the snapshot
// src returns.
type statsCollector[S any] struct {
	src   func() S
	stats []stat[S]
}

func (c *statsCollector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.stats {
		ch <- s.desc
	}
}

func (c *statsCollector[S]) Collect(ch chan<- prometheus.Metric) {
	st := c.src()
	for _, s := range c.stats {
		ch <- prometheus.MustNewConstMetric(s.desc, s.kind, float64(s.value(st)))
	}
}

// ProxyStats is what the proxy holds at one moment.
type ProxyStats struct {
	// InFlight counts requests from arrival until their answer is written.
	InFlight int64
	// Conns counts open client connections (limits.max_connections).
	Conns int64
	// BodyBytes is the memory held by request bodies being read or
	// forwarded (limits.max_body_buffer_bytes).
	BodyBytes int64
}

// AddProxy registers gauges reading src at scrape time: requests in
// flight, client connections and request-body buffers.
func (m *Metrics) AddProxy(src func() ProxyStats) {
	m.Registry.MustRegister(&statsCollector[ProxyStats]{src: src, stats: proxyStats})
}

// proxyStats are the proxy's metrics.
var proxyStats = []stat[ProxyStats]{
	{prometheus.NewDesc("kvroute_in_flight_requests", "Requests from arrival until the last byte of their answer is written (limits.max_inflight bounds it).", nil, nil),
		prometheus.GaugeValue, func(s ProxyStats) int64 { return s.InFlight }},
	{prometheus.NewDesc("kvroute_client_connections", "Open client connections (limits.max_connections bounds them).", nil, nil),
		prometheus.GaugeValue, func(s ProxyStats) int64 { return s.Conns }},
	{prometheus.NewDesc("kvroute_body_buffer_bytes", "Bytes held by request bodies being read or forwarded (limits.max_body_buffer_bytes bounds them).", nil, nil),
		prometheus.GaugeValue, func(s ProxyStats) int64 { return s.BodyBytes }},
}

// IndexStats is what the router's Index has counted: placements recorded
// by source (router, peer, engine) and trims on engines' reports.
type IndexStats struct {
	Writes map[string]uint64
	Trims  uint64
}

// AddIndex registers counters reading src at scrape time.
func (m *Metrics) AddIndex(src func() IndexStats) {
	m.Registry.MustRegister(&indexCollector{src: src})
}

type indexCollector struct{ src func() IndexStats }

var (
	descIndexWrites = prometheus.NewDesc("kvroute_index_writes_total", "Placements recorded in the prefix index, by who wrote them (router: this router's own).", []string{"source"}, nil)
	descIndexTrims  = prometheus.NewDesc("kvroute_index_trims_total", "Index entries trimmed because an engine reported fewer cached tokens than predicted (evictions the router could not see).", nil, nil)
)

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descIndexWrites
	ch <- descIndexTrims
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src()
	for src, n := range st.Writes {
		ch <- prometheus.MustNewConstMetric(descIndexWrites, prometheus.CounterValue, float64(n), src)
	}
	ch <- prometheus.MustNewConstMetric(descIndexTrims, prometheus.CounterValue, float64(st.Trims))
}
