package backends

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// Check paths and the Accept header asking for the classic Prometheus text
// format (prometheus_client would otherwise be free to negotiate OpenMetrics).
const (
	pathHealth    = "/health"
	pathModels    = "/v1/models"
	pathMetrics   = "/metrics"
	acceptMetrics = "text/plain; version=0.0.4; charset=utf-8"
)

// errStatus is a non-2xx answer to a check.
type errStatus struct {
	path string
	code int
}

func (e *errStatus) Error() string { return fmt.Sprintf("GET %s: status %d", e.path, e.code) }

// get performs GET path on the check client within timeout and, on a 2xx
// answer, hands the buffered response to handle (which must not retain it).
func (r *Replica) get(path, accept string, timeout time.Duration, handle func(*fasthttp.Response) error) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(r.target.base + path)
	req.Header.SetMethod(fasthttp.MethodGet)
	if accept != "" {
		req.Header.Set(fasthttp.HeaderAccept, accept)
	}
	if err := r.checks.DoTimeout(req, resp, timeout); err != nil {
		return fmt.Errorf("GET %s: %w", path, err)
	}
	if code := resp.StatusCode(); code < 200 || code > 299 {
		return &errStatus{path: path, code: code}
	}
	if handle == nil {
		return nil
	}
	return handle(resp)
}

// checkHealth is one active health round: GET /health, then, when it passed
// and the spec lists no models, GET /v1/models. The end of the replica's
// first round, however it went, is signalled on r.checked.
func (r *Replica) checkHealth() {
	defer r.checkedOnce.Do(func() { close(r.checked) })
	if err := r.get(pathHealth, "", r.opts.HealthTimeout, nil); err != nil {
		r.recordFailure(err, "active")
		return
	}
	r.markUp()
	if r.spec.Load().static == nil {
		r.fetchModels()
	}
}

// fetchModels refreshes the fetched model list. On failure, or on an empty
// list, the previous list is kept.
func (r *Replica) fetchModels() {
	var ids []string
	var objs [][]byte
	err := r.get(pathModels, "application/json", r.opts.HealthTimeout, func(resp *fasthttp.Response) error {
		var err error
		ids, objs, err = parseModels(resp.Body())
		return err
	})
	if err == nil && len(ids) == 0 {
		err = errors.New("GET /v1/models: empty model list")
	}
	if err != nil {
		r.debugLimited(&r.modelsLogAt, false, "models fetch failed", zap.Error(err))
		return
	}
	ms := newModelSet(ids, objs)
	prev := r.fetched.Load()
	if ms.equal(prev) {
		return
	}
	r.fetched.Store(ms)
	if prev == nil || !slices.Equal(prev.list, ms.list) {
		r.log.Info("models", zap.Strings("models", ms.list))
	}
}

// pollMetrics is one metrics round: GET /metrics, parse, publish. A failure
// keeps the previous snapshot (which then goes stale) and never touches
// health.
func (r *Replica) pollMetrics() {
	// Capture the router's counters before the request: anything dispatched
	// afterwards may be missing from what the engine reports.
	inFlight := r.Load()
	dispatched := r.dispatched.Load()
	sp := r.spec.Load().spec
	rank := -1
	if sp.DataParallelSize > 1 {
		rank = sp.DataParallelRank
	}
	var snap Snapshot
	err := r.get(pathMetrics, acceptMetrics, r.opts.MetricsTimeout, func(resp *fasthttp.Response) error {
		var err error
		snap, err = ParseRankMetrics(bytes.NewReader(resp.Body()), sp.Engine, rank)
		return err
	})
	if err != nil {
		first := r.metricsFailing.CompareAndSwap(false, true)
		r.debugLimited(&r.metricsLogAt, first, "metrics poll failed", zap.Error(err))
		return
	}
	snap.At = time.Now()
	snap.InFlightAtScrape = inFlight
	snap.DispatchedAtScrape = dispatched
	r.snap.Store(&snap)
	if r.metricsFailing.CompareAndSwap(true, false) {
		if ce := r.log.Check(zap.DebugLevel, "metrics poll recovered"); ce != nil {
			ce.Write()
		}
	}
}
