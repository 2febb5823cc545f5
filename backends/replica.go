package backends

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/lograte"
	"github.com/kvroute/kvroute/outcomes"
)

// idleConnTimeout closes pooled connections idle for longer than this. It is
// below uvicorn's default keep-alive timeout (5s), which both vLLM and SGLang
// serve with, so the pool rarely hands out a connection the replica is
// closing.
const idleConnTimeout = 3 * time.Second

// checkConns caps the connections of the small per-replica client used by
// health, models and metrics checks (at most three run at once: the two loops
// plus CheckNow).
const checkConns = 4

// maxCheckBody bounds a /health, /v1/models or /metrics response, in bytes.
const maxCheckBody = 16 << 20

// specState is a replica's current spec with its static model set.
type specState struct {
	spec   Spec
	static *modelSet // nil when spec.Models is empty
	// rankHeader is spec.DataParallelRank in decimal when the spec has
	// ranks, else "".
	rankHeader string
}

// Replica is one inference server: its configuration, its pooled client and
// its runtime state. All methods are safe for concurrent use; the reader
// methods do not lock. A Replica is created by a [Fleet] and stays valid (its
// client still usable) after [Fleet.Update] removes it, so a request already
// routed to it can finish.
type Replica struct {
	id     int
	name   string
	target target
	opts   *Options // resolved, shared with the fleet, read-only
	log    *zap.Logger
	// timeouts are the proxy client's read timeouts, shared with the fleet.
	timeouts *readTimeouts

	client *fasthttp.HostClient // proxied traffic
	checks *fasthttp.HostClient // health, models and metrics checks

	tokens outcomes.Window // whether the renderer's prompt lengths differed from the engine's (NoteTokenCounts)

	spec    atomic.Pointer[specState]
	fetched atomic.Pointer[modelSet]
	snap    atomic.Pointer[Snapshot]
	lastErr atomic.Pointer[string]

	inFlight   atomic.Int64
	peerLoad   atomic.Int64 // other routers' requests in flight to it (SetPeerInFlight)
	dispatched atomic.Uint64
	fails      atomic.Int64 // consecutive failed requests (passive)
	checkFails atomic.Int64 // consecutive failed health checks (active)
	ejected    atomic.Bool
	ejections  atomic.Int64

	metricsFailing atomic.Bool
	metricsLogAt   atomic.Int64     // unix ns of the last metrics debug log
	modelsLogAt    atomic.Int64     // unix ns of the last models debug log
	strayLog       *lograte.Limiter // the stray-bytes warning, once per debugEvery

	tls atomic.Pointer[replicaTLS] // for new connections

	checked     chan struct{} // closed when the first health round is over
	checkedOnce sync.Once

	mu      sync.Mutex // guards stop and removed
	stop    context.CancelFunc
	removed bool
	loops   sync.WaitGroup
}

// debugEvery rate-limits the debug logs of a failing metrics or models fetch,
// per replica.
const debugEvery = 30 * time.Second

// strayBytes warns, at most once per debugEvery with the count left out,
// that the replica sent bytes outside an answer on a kept-alive connection
// (which is then closed, never reused): an engine or proxy in front of it
// that breaks HTTP/1.1 framing.
func (r *Replica) strayBytes() {
	r.strayLog.Warn("stray_bytes", "replica sent bytes outside an answer; connection closed, not reused")
}

func newReplica(id int, s Spec, t target, opts *Options, timeouts *readTimeouts, log *zap.Logger) *Replica {
	r := &Replica{
		id:       id,
		name:     s.Name,
		target:   t,
		opts:     opts,
		log:      log.With(zap.String("replica", s.Name), zap.String("url", t.base)),
		timeouts: timeouts,
		checked:  make(chan struct{}),
	}
	r.strayLog = lograte.New(r.log, debugEvery)
	r.setSpec(s)
	r.setTLS(t)
	r.client, r.checks = r.newClients()
	return r
}

// requestWriteBuffer is the size of the buffer a request to a replica is
// written through, in bytes: a request up to this size (headers and body)
// leaves in one write system call, where fasthttp's default 4 KiB would
// send a 16 KiB prompt in two. Writers are pooled per request in flight,
// not kept per connection.
const requestWriteBuffer = 64 << 10

// newClients builds the proxy client and the check client of the replica.
// Both dial through a [dialer], which runs the TLS handshake of https
// connections itself, with the configuration current at the time (see
// [Replica.setTLS]), so the clients' own TLSConfig stays unused; the proxy
// client's also dials through Options.Dial when set, and puts the read
// timeouts and the head checks on its connections.
func (r *Replica) newClients() (proxy, checks *fasthttp.HostClient) {
	t, o := r.target, r.opts
	checkDial := dialer{connect: o.ConnectTimeout, tls: r.tlsConfig, raw: fasthttp.DialDualStackTimeout, onStray: r.strayBytes}
	proxyDial := checkDial
	proxyDial.timeouts = r.timeouts
	if o.Dial != nil {
		proxyDial.raw = func(addr string, _ time.Duration) (net.Conn, error) { return o.Dial(addr) }
	}
	proxy = &fasthttp.HostClient{
		Addr:                t.addr,
		IsTLS:               t.tls,
		DialTimeout:         proxyDial.Dial,
		MaxConns:            o.MaxConnsPerReplica,
		MaxConnWaitTimeout:  o.MaxConnWaitTimeout,
		MaxIdleConnDuration: idleConnTimeout,
		// The only retries are on another connection when the pooled one
		// was stale (strayGuard): nothing was sent on it.
		MaxIdemponentCallAttempts:     1 + staleRetries,
		RetryIfErr:                    retryStale,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: true,
		DisablePathNormalizing:        true,
		StreamResponseBody:            true,
		WriteBufferSize:               requestWriteBuffer,
	}
	checks = &fasthttp.HostClient{
		Addr:                t.addr,
		IsTLS:               t.tls,
		Name:                "kvroute",
		DialTimeout:         checkDial.Dial,
		MaxConns:            checkConns,
		MaxConnWaitTimeout:  max(o.HealthTimeout, o.MetricsTimeout),
		MaxIdleConnDuration: idleConnTimeout,
		// One retry, within the same deadline, absorbs a keep-alive
		// connection the replica closed between two checks; without it such
		// a race would count as a health failure. Stale pooled connections
		// (strayGuard) are retried past it, each on another connection.
		MaxIdemponentCallAttempts: 2 + staleRetries,
		RetryIfErr: func(req *fasthttp.Request, attempts int, err error) (bool, bool) {
			_, stale := retryStale(req, attempts, err)
			return false, stale || attempts == 1
		},
		MaxResponseBodySize: maxCheckBody,
	}
	return proxy, checks
}

func (r *Replica) setSpec(s Spec) {
	s = cloneSpec(s)
	st := &specState{spec: s}
	if s.DataParallelSize > 1 {
		st.rankHeader = strconv.Itoa(s.DataParallelRank)
	}
	if len(s.Models) > 0 {
		// An unchanged list keeps its objects, and so their created time.
		if old := r.spec.Load(); old != nil && old.static != nil && slices.Equal(old.spec.Models, s.Models) {
			st.static = old.static
		} else {
			st.static = staticModelSet(s.Models, time.Now().Unix())
		}
	}
	r.spec.Store(st)
}

// Spec returns the replica's current configuration (a copy). Everything
// but Name and URL (Engine, Models, Weight, Backup, TLS, ...) of a kept
// replica may change with [Fleet.Update]; Name and URL never do.
func (r *Replica) Spec() Spec { return cloneSpec(r.spec.Load().spec) }

// Name returns the replica's unique name.
func (r *Replica) Name() string { return r.name }

// ID returns the replica's dense index: small, unique among the fleet's
// current replicas and stable for the replica's lifetime in the fleet, so it
// can index slices and bitsets. IDs of removed replicas are reused by
// replicas added in later Updates (never by the Update that removed them).
func (r *Replica) ID() int { return r.id }

// Client returns the one pooled client for proxied traffic to this replica.
// It dials with Options.ConnectTimeout, holds at most
// Options.MaxConnsPerReplica connections (waiting Options.MaxConnWaitTimeout
// for a free one), never retries a request that reached the replica
// (retries belong to the router; a request whose pooled connection turned
// out stale, before any byte of it was sent, goes on another connection:
// a connection that received bytes outside an answer is closed, never
// reused), has no overall read or write timeout (a request's reads are
// bounded instead by Options.FirstByteTimeout and Options.StreamIdleTimeout,
// see [Fleet.SetTimeouts]), refuses a response head with a bare-LF line
// ending or status 101 with [ErrBadResponseHead], streams response bodies,
// keeps header names and paths byte for byte as given, sends no default
// User-Agent, and closes connections idle for over 3s. It dials with
// Options.Dial when set, else with a built-in dialer; for https the TLS
// handshake is part of the dial, within ConnectTimeout. TLS follows
// [Spec.TLS] over Options.TLSConfig (default: system roots). Point a request
// at the replica with [Replica.SetRequestURI].
func (r *Replica) Client() *fasthttp.HostClient { return r.client }

// Healthy reports whether the replica is in service (not ejected). Replicas
// start healthy, before any check has run.
func (r *Replica) Healthy() bool { return !r.ejected.Load() }

// InFlight returns the number of acquired, not yet released requests.
func (r *Replica) InFlight() int64 { return r.inFlight.Load() }

// SetPeerInFlight records the number of requests other routers of the same
// cluster have in flight to the replica, as they last reported it.
func (r *Replica) SetPeerInFlight(n int64) { r.peerLoad.Store(max(n, 0)) }

// PeerInFlight returns what SetPeerInFlight last recorded.
func (r *Replica) PeerInFlight() int64 { return r.peerLoad.Load() }

// Load returns the fleet-wide number of requests in flight to the replica:
// this router's (InFlight) and its peers' (PeerInFlight). Routing decisions
// weigh this, so that several routers do not each believe a replica idle.
func (r *Replica) Load() int64 { return r.inFlight.Load() + r.peerLoad.Load() }

// PoolFull reports whether a request sent now would find every connection
// of [Replica.Client] taken: the requests in flight (each holds at most one
// connection from before it is sent until [Replica.Acquire]'s release) reach
// Options.MaxConnsPerReplica. Such a request waits up to
// Options.MaxConnWaitTimeout for a connection, then fails with
// fasthttp.ErrNoFreeConns. A full pool is load, not a fault.
func (r *Replica) PoolFull() bool { return r.inFlight.Load() >= int64(r.opts.MaxConnsPerReplica) }

// Dispatched returns the monotonic count of [Replica.Acquire] calls.
func (r *Replica) Dispatched() uint64 { return r.dispatched.Load() }

// Acquire counts one request routed to the replica: in-flight +1 and
// dispatched +1. The returned release decrements in-flight once; calling it
// again is a no-op, so it is safe to both defer it and call it early.
func (r *Replica) Acquire() (release func()) {
	r.inFlight.Add(1)
	r.dispatched.Add(1)
	var done atomic.Bool
	return func() {
		if done.CompareAndSwap(false, true) {
			r.inFlight.Add(-1)
		}
	}
}

// Snapshot returns the last published metrics snapshot, nil if none. The
// snapshot is shared and must not be modified.
func (r *Replica) Snapshot() *Snapshot { return r.snap.Load() }

// Fresh reports whether a snapshot exists and is at most Options.StaleAfter
// old at now.
func (r *Replica) Fresh(now time.Time) bool {
	_, fresh := r.SnapshotAt(now)
	return fresh
}

// SnapshotAt returns the latest snapshot (nil before the first scrape) and
// whether it is fresh at now, from one load of it.
func (r *Replica) SnapshotAt(now time.Time) (s *Snapshot, fresh bool) {
	s = r.snap.Load()
	return s, s != nil && now.Sub(s.At) <= r.opts.StaleAfter
}

// CacheTokens returns the replica's prefix-cache capacity in tokens: the
// configured value when there is one, else the capacity its last metrics
// snapshot reported, else 0 (unknown).
func (r *Replica) CacheTokens() int64 {
	if t := r.spec.Load().spec.CacheTokens; t > 0 {
		return t
	}
	if s := r.snap.Load(); s != nil && s.KVCapacityTokens > 0 {
		return s.KVCapacityTokens
	}
	return 0
}

// Models returns the static model list of the spec if it has one, else the
// last list fetched from GET /v1/models (nil before the first successful
// fetch). The slice is shared and must not be modified.
func (r *Replica) Models() []string {
	if ms := r.modelSet(); ms != nil {
		return ms.list
	}
	return nil
}

func (r *Replica) modelSet() *modelSet {
	if st := r.spec.Load(); st.static != nil {
		return st.static
	}
	return r.fetched.Load()
}

// Serves reports whether the replica serves model. A replica with no known
// models (no static list and no successful fetch yet, or an empty list
// fetched) is assumed to serve every model: the router cannot know better,
// and excluding it would empty the fleet at startup.
func (r *Replica) Serves(model string) bool {
	ms := r.modelSet()
	if ms == nil || len(ms.list) == 0 {
		return true
	}
	_, ok := ms.set[model]
	return ok
}

// ReportSuccess records a request the replica served: it resets the count of
// consecutive failed requests. It does not return an ejected replica to
// service; only a passing active health check does.
func (r *Replica) ReportSuccess() { r.fails.Store(0) }

// ReportFailure records a request that failed because of the replica (dial
// error, reset, 5xx, timeout). At Options.FailThreshold consecutive failed
// requests (or failed health checks, counted apart) the replica is ejected
// until a health check passes. A passing health check does not break a
// streak of failed requests: a replica whose health endpoint answers while
// its requests fail is ejected all the same. An err that is not the replica's fault (see [IsReplicaFault]: a
// full pool, a client gone away, the router's own limits) is ignored: it
// neither counts nor resets the count. A nil err counts.
func (r *Replica) ReportFailure(err error) { r.recordFailure(err, "passive") }

// LastError returns the most recent failure that counted towards ejection
// (passive report or failed health check), kept after recovery; "" if none.
// Metrics errors are not recorded here: they never affect health.
func (r *Replica) LastError() string {
	if p := r.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// Ejections returns how many times the replica was ejected.
func (r *Replica) Ejections() int64 { return r.ejections.Load() }

// ConsecutiveFailures returns the longer of the current streaks of failed
// requests and failed health checks.
func (r *Replica) ConsecutiveFailures() int64 { return max(r.fails.Load(), r.checkFails.Load()) }

// FailedRequests returns the current streak of failed requests.
func (r *Replica) FailedRequests() int64 { return r.fails.Load() }

// recordFailure counts a failure, passive or active, unless err is not the
// replica's fault (a health check that could not run because kvroute is out
// of file descriptors says nothing about the replica either).
func (r *Replica) recordFailure(err error, kind string) {
	if err == nil {
		err = errors.New("unspecified failure")
	} else if !IsReplicaFault(err) {
		if ce := r.log.Check(zap.DebugLevel, "failure not counted: not the replica's fault"); ce != nil {
			ce.Write(zap.String("kind", kind), zap.Error(err))
		}
		return
	}
	msg := err.Error()
	r.lastErr.Store(&msg)
	streak := &r.fails
	if kind == "active" {
		streak = &r.checkFails
	}
	n := streak.Add(1)
	if n >= int64(r.opts.FailThreshold) && r.ejected.CompareAndSwap(false, true) {
		r.ejections.Add(1)
		r.log.Warn("replica ejected",
			zap.String("kind", kind), zap.Int64("failures", n), zap.Error(err))
		return
	}
	if ce := r.log.Check(zap.DebugLevel, "replica failure"); ce != nil {
		ce.Write(zap.String("kind", kind), zap.Int64("failures", n), zap.Error(err))
	}
}

// markUp records a passing health check: it ends the streak of failed
// checks, and returns an ejected replica to service with its streak of
// failed requests started over.
func (r *Replica) markUp() {
	r.checkFails.Store(0)
	if r.ejected.CompareAndSwap(true, false) {
		r.fails.Store(0)
		r.log.Info("replica back in service")
	}
}

// startLoops starts the health and metrics loops, tied to ctx. No-op if they
// run already or the replica was removed.
func (r *Replica) startLoops(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil || r.removed {
		return
	}
	ctx, r.stop = context.WithCancel(ctx)
	r.loops.Add(2)
	go r.loop(ctx, "health", r.opts.HealthInterval, r.checkHealth)
	go r.loop(ctx, "metrics", r.opts.MetricsInterval, r.pollMetrics)
}

// retire marks the replica removed so its loops are never (re)started, stops
// them, waits for them to return (at most one check timeout) and closes idle
// connections. Connections in use by proxied requests are left alone.
func (r *Replica) retire() {
	r.mu.Lock()
	r.removed = true
	stop := r.stop
	r.mu.Unlock()
	if stop != nil {
		stop()
	}
	r.loops.Wait()
	r.checks.CloseIdleConnections()
	r.client.CloseIdleConnections()
}

// loop runs round now and then every interval until ctx is done.
func (r *Replica) loop(ctx context.Context, what string, every time.Duration, round func()) {
	defer r.loops.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for ctx.Err() == nil {
		r.safely(what, round)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// safely runs one round, logging a panic instead of dying.
func (r *Replica) safely(what string, round func()) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("panic in background check", zap.String("check", what),
				zap.Any("panic", p), zap.Stack("stack"))
		}
	}()
	round()
}

// debugLimited logs msg at debug level at most once per debugEvery, or always
// when first is set.
func (r *Replica) debugLimited(at *atomic.Int64, first bool, msg string, fields ...zap.Field) {
	ce := r.log.Check(zap.DebugLevel, msg)
	if ce == nil {
		return
	}
	now := time.Now().UnixNano()
	prev := at.Load()
	if !first && prev != 0 && now-prev < int64(debugEvery) {
		return
	}
	if !at.CompareAndSwap(prev, now) {
		return
	}
	ce.Write(fields...)
}
