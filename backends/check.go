package backends

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
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
// and the spec lists no models, GET /v1/models.
func (r *Replica) checkHealth() {
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
	err := r.get(pathModels, "application/json", r.opts.HealthTimeout, func(resp *fasthttp.Response) error {
		var err error
		ids, err = parseModels(resp.Body())
		return err
	})
	if err == nil && len(ids) == 0 {
		err = errors.New("GET /v1/models: empty model list")
	}
	if err != nil {
		r.debugLimited(&r.modelsLogAt, false, "models fetch failed", zap.Error(err))
		return
	}
	if prev := r.fetched.Load(); prev != nil && slices.Equal(prev.list, ids) {
		return
	}
	r.fetched.Store(newModelSet(ids))
	r.log.Info("models", zap.Strings("models", ids))
}

// parseModels reads the ids of an OpenAI model list,
// {"object":"list","data":[{"id":"..."},...]}. The ids are copies.
func parseModels(body []byte) ([]string, error) {
	v, err := fastjson.ParseBytes(body)
	if err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	data := v.Get("data")
	if data == nil || data.Type() != fastjson.TypeArray {
		return nil, errors.New(`GET /v1/models: no "data" array`)
	}
	items, _ := data.Array()
	ids := make([]string, 0, len(items))
	for _, it := range items {
		if id := it.GetStringBytes("id"); len(id) > 0 {
			ids = append(ids, string(id))
		}
	}
	return ids, nil
}

// pollMetrics is one metrics round: GET /metrics, parse, publish. A failure
// keeps the previous snapshot (which then goes stale) and never touches
// health.
func (r *Replica) pollMetrics() {
	// Capture the router's counters before the request: anything dispatched
	// afterwards may be missing from what the engine reports.
	inFlight := r.inFlight.Load()
	dispatched := r.dispatched.Load()
	engine := r.spec.Load().spec.Engine
	var snap Snapshot
	err := r.get(pathMetrics, acceptMetrics, r.opts.MetricsTimeout, func(resp *fasthttp.Response) error {
		var err error
		snap, err = ParseMetrics(bytes.NewReader(resp.Body()), engine)
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
