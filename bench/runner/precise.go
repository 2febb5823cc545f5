package runner

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// NamePrecise is kvroute's cache_aware policy in precise mode: its fleet
// publishes KV events, which kvroute follows, and requests are keyed by
// the tokens replica 0 renders.
const NamePrecise = "kvroute/cache_aware+precise"

// preciseSuffix ends the X-Kvroute-Route of a decision made on exact
// tokens, and the name of a precise Kvroute.
const preciseSuffix = "+precise"

// defaultRenderTimeout is precise.render_timeout in the benchmark unless
// Options.PreciseRenderTimeout says otherwise: kvroute's default. A render
// is real work on the real clock (the sim's tokenizer over the whole
// prompt), so it is not scaled with the fleet's time.
const defaultRenderTimeout = 20 * time.Millisecond

// renderTimeout is k's precise.render_timeout.
func (k *Kvroute) renderTimeout() time.Duration {
	if k.RenderTimeout > 0 {
		return k.RenderTimeout
	}
	return defaultRenderTimeout
}

// PreciseResult is what precise mode did during one run of a precise
// kvroute: how many of its decisions were made on exact tokens, what its
// renders cost, and what its replicas' event streams went through.
type PreciseResult struct {
	// Decisions counts the responses that carried X-Kvroute-Route;
	// PreciseDecisions those whose route ends in " precise"; Share the
	// second over the first.
	Decisions        int     `json:"decisions"`
	PreciseDecisions int     `json:"precise_decisions"`
	Share            float64 `json:"precise_share"`
	// PrecisePredicted and PreciseEngineCached are the predicted and
	// engine-reported cached tokens of the precise decisions alone
	// (kvroute_*_cached_tokens_total{mode="precise"}); PrecisePrecision is
	// the second over the first. The rest of the router's precision is its
	// decisions on the approximate key (fallbacks, approximate replicas).
	PrecisePredicted    int64   `json:"precise_predicted_cached_tokens"`
	PreciseEngineCached int64   `json:"precise_engine_cached_tokens"`
	PrecisePrecision    float64 `json:"precise_precision"`
	// Renders counts kvroute_precise_renders_total by result (rendered,
	// tokenized, cache_hit, pass_through); Fallbacks
	// kvroute_precise_fallbacks_total by reason (timeout, not_served,
	// unkeyed, error): requests routed on the approximate key.
	Renders   map[string]uint64 `json:"renders,omitempty"`
	Fallbacks map[string]uint64 `json:"fallbacks,omitempty"`
	// RenderP99 is kvroute_precise_render_seconds_p99 at the end of the
	// run, in real seconds: a render is not simulated, so it is not scaled.
	RenderP99 float64 `json:"render_p99_real_s"`
	// Gaps, Replays and Resets sum kvroute_kv_events_gaps_total,
	// _replays_total and _resets_total over the replicas.
	Gaps    uint64 `json:"event_gaps"`
	Replays uint64 `json:"event_replays"`
	Resets  uint64 `json:"event_resets"`
	// Followed is the number of replicas whose events kvroute followed at
	// the end of the run, PreciseReplicas those of them precise then.
	Followed        int `json:"followed_replicas"`
	PreciseReplicas int `json:"precise_replicas"`
	// EventsCutAfter and EventsRestoredAfter are the numbers of requests
	// completed when every replica's event stream was cut and restored
	// (Options.PreciseCutEvents); zero when none was.
	EventsCutAfter      int `json:"events_cut_after,omitempty"`
	EventsRestoredAfter int `json:"events_restored_after,omitempty"`
}

// fleetConfig returns the configuration of the replicas r runs in front
// of: simCfg, with KV events published (tagged encoding, a replay socket,
// free ports) for a precise kvroute, and for every router of a run that
// has one (publish): engines with events on do work that engines without
// do not (the blocks' token ids, the encoding), so the routers compared
// are served by engines alike, whether or not they follow the events.
func fleetConfig(r Router, simCfg sim.Config, publish bool) sim.Config {
	if publish || isPrecise(r) {
		simCfg.KVEvents = true
		simCfg.KVEventsEncoding = "tagged"
		simCfg.KVEventsPort, simCfg.KVEventsReplayPort = 0, 0
	}
	return simCfg
}

// isPrecise reports whether r is a kvroute in precise mode.
func isPrecise(r Router) bool {
	k, ok := r.(*Kvroute)
	return ok && k.Precise
}

// startRouter starts r in front of fleet: a precise kvroute on the
// fleet's events and renderer, any other router on its URLs.
func startRouter(ctx context.Context, r Router, fleet *sim.Fleet, dir string) (Instance, error) {
	if k, ok := r.(*Kvroute); ok && k.Precise {
		return k.startPrecise(ctx, fleet, dir)
	}
	return r.Start(ctx, fleet.URLs, dir)
}

// startPrecise is Start for a precise kvroute: every backend follows its
// replica's KV events and renders come from replica 0.
func (k *Kvroute) startPrecise(ctx context.Context, fleet *sim.Fleet, dir string) (Instance, error) {
	evs := fleet.KVEvents()
	for i, ev := range evs {
		if ev.Endpoint == "" {
			return nil, fmt.Errorf("kvroute precise: replica %d publishes no KV events", i)
		}
	}
	cfg, err := k.config(fleet.URLs, evs, dir)
	if err != nil {
		return nil, fmt.Errorf("kvroute config: %w", err)
	}
	inst, err := k.serve(ctx, cfg, dir)
	if err != nil {
		return nil, err
	}
	inst.precise = true
	return inst, nil
}

// kvEventsYAML is a backend entry's kv_events, for a configuration file
// (to follow the entry's url).
func kvEventsYAML(endpoint, replay, topic string) string {
	return fmt.Sprintf("    kv_events:\n      endpoint: %q\n      replay_endpoint: %q\n      topic: %q\n", endpoint, replay, topic)
}

// preciseSectionYAML is a configuration file's precise section: renders
// from url within timeout.
func preciseSectionYAML(url string, timeout time.Duration) string {
	return fmt.Sprintf("precise:\n  render_url: %q\n  render_timeout: %s\n", url, timeout)
}

// setPrecise puts precise mode into cfg: backend i follows evs[i], and
// renders come from the first backend within timeout.
func setPrecise(cfg *config.Config, evs []sim.KVEventsEndpoint, timeout time.Duration) {
	for i := range cfg.Backends {
		ev := evs[i]
		cfg.Backends[i].KVEvents = &config.KVEvents{Endpoint: ev.Endpoint, ReplayEndpoint: ev.ReplayEndpoint, Topic: ev.Topic}
	}
	cfg.Precise.RenderURL = cfg.Backends[0].URL
	cfg.Precise.RenderTimeout = timeout
}

// preciseResult reads what precise mode did from the samples' routes and
// kvroute's metrics.
func (i *kvrouteInstance) preciseResult(out *load.Result) (*PreciseResult, error) {
	p := &PreciseResult{Renders: map[string]uint64{}, Fallbacks: map[string]uint64{}, EventsCutAfter: int(i.cutAfter.Load()), EventsRestoredAfter: int(i.restoredAfter.Load())}
	if out != nil {
		for _, s := range out.Samples {
			if s.Route == "" {
				continue
			}
			p.Decisions++
			if strings.HasSuffix(s.Route, " precise") {
				p.PreciseDecisions++
			}
		}
	}
	p.Share = ratio(int64(p.PreciseDecisions), int64(p.Decisions))
	mfs, err := i.gather()
	if err != nil {
		return p, err
	}
	seen := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "kvroute_predicted_cached_tokens_total":
				if label(m, "mode") == "precise" {
					p.PrecisePredicted += int64(m.GetCounter().GetValue())
				}
			case "kvroute_engine_cached_tokens_total":
				if label(m, "mode") == "precise" {
					p.PreciseEngineCached += int64(m.GetCounter().GetValue())
				}
			case "kvroute_precise_renders_total":
				p.Renders[label(m, "result")] += uint64(m.GetCounter().GetValue())
			case "kvroute_precise_fallbacks_total":
				p.Fallbacks[label(m, "reason")] += uint64(m.GetCounter().GetValue())
			case "kvroute_precise_render_seconds_p99":
				p.RenderP99 = m.GetGauge().GetValue()
				seen = true
			case "kvroute_kv_events_gaps_total":
				p.Gaps += uint64(m.GetCounter().GetValue())
			case "kvroute_kv_events_replays_total":
				p.Replays += uint64(m.GetCounter().GetValue())
			case "kvroute_kv_events_resets_total":
				p.Resets += uint64(m.GetCounter().GetValue())
			case "kvroute_backend_precise":
				p.Followed++
				if m.GetGauge().GetValue() == 1 {
					p.PreciseReplicas++
				}
			}
		}
	}
	p.PrecisePrecision = ratio(p.PreciseEngineCached, p.PrecisePredicted)
	if !seen {
		return p, errors.New("kvroute exports no precise metrics: precise mode is off")
	}
	return p, nil
}

// onDone is what runOne calls as each request of n completes: the
// progress bar's step and, for a precise kvroute inst with cut = {cut,
// restore}, the cut of every replica's event stream once cut × n requests
// have completed and its restore at restore × n, recorded in inst for the
// report.
func onDone(inst Instance, fleet *sim.Fleet, n int, cut []float64, b *bar) func(int, load.Sample) {
	ki, ok := inst.(*kvrouteInstance)
	if !ok || !ki.precise || len(cut) != 2 {
		return func(int, load.Sample) { b.add() }
	}
	cutAt := max(1, int(math.Ceil(cut[0]*float64(n))))
	restoreAt := max(cutAt+1, int(math.Ceil(cut[1]*float64(n))))
	var done atomic.Int64
	return func(int, load.Sample) {
		b.add()
		switch int(done.Add(1)) {
		case cutAt:
			for _, rep := range fleet.Replicas {
				rep.CutKVEvents()
			}
			ki.cutAfter.Store(int64(cutAt))
		case restoreAt:
			for _, rep := range fleet.Replicas {
				rep.RestoreKVEvents()
			}
			ki.restoredAfter.Store(int64(restoreAt))
		}
	}
}

// label is the value of m's label name.
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// total sums a count by kind.
func total(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// preciseHeader and preciseCells are the columns of precise mode in the
// reports' tables: precise decisions, renders, fallbacks, render p99 and
// the event streams' gaps, replays and resets.
const preciseHeader = "precise decisions | their precision | renders | fallbacks | render p99 (real) | event gaps / replays / resets | precise replicas at end"

func preciseCells(p *PreciseResult) string {
	if p == nil {
		return "– | – | – | – | – | – | –"
	}
	kinds := func(m map[string]uint64) string {
		n := total(m)
		if n == 0 {
			return "0"
		}
		byKind := map[string]int{}
		for k, v := range m {
			if v > 0 {
				byKind[k] = int(v)
			}
		}
		return fmt.Sprintf("%d (%s)", n, sortedKinds(byKind))
	}
	return fmt.Sprintf("%s (%d/%d) | %s | %s | %s | %.2f ms | %d / %d / %d | %d/%d",
		pct(p.Share), p.PreciseDecisions, p.Decisions, fractionCell(p.PrecisePrecision, p.PrecisePredicted != 0), kinds(p.Renders), kinds(p.Fallbacks), 1000*p.RenderP99,
		p.Gaps, p.Replays, p.Resets, p.PreciseReplicas, p.Followed)
}

// pairPrecise puts the approximate kvroute/cache_aware right before the
// precise one, adding it when routers lack it, so that the two run in the
// same invocation side by side. routers hold each name once.
func pairPrecise(routers []Router) []Router {
	pi, ai := -1, -1
	for i, r := range routers {
		if k, ok := r.(*Kvroute); ok && k.Policy == router.CacheAwareName && k.Flow == nil {
			if k.Precise {
				pi = i
			} else {
				ai = i
			}
		}
	}
	if pi < 0 {
		return routers
	}
	out := make([]Router, 0, len(routers)+1)
	for i, r := range routers {
		switch {
		case i == pi && ai < 0:
			out = append(out, &Kvroute{Policy: router.CacheAwareName}, r)
		case i == pi:
		case i == ai:
			out = append(out, r, routers[pi])
		default:
			out = append(out, r)
		}
	}
	return out
}

// preciseNote explains the precise table's columns.
const preciseNote = "*precise decisions* are the responses whose X-Kvroute-Route ends in \"precise\" (routed on the engine's own tokens, over a replica whose KV events are live); " +
	"renders (by result) and fallbacks to the approximate key (by reason) are kvroute's counters; the render p99 is real time, not scaled; " +
	"event gaps, replays and resets are summed over the replicas. *precision* is engine-reported over predicted cached tokens, over all decisions; *their precision* over the precise decisions alone."

// preciseMarkdown renders, when a precise kvroute ran, a table of every
// predicting router's precision beside precise mode's figures.
func (r *Report) preciseMarkdown(w func(format string, args ...any)) {
	if !slices.ContainsFunc(r.Results, func(res RouterResult) bool { return res.Precise != nil }) {
		return
	}
	w("\nPrecise mode: %s\n\n| router | precision | %s |\n| --- | ---: |%s\n", preciseNote, preciseHeader, strings.Repeat(" ---: |", 7))
	for i := range r.Results {
		res := &r.Results[i]
		if res.PredictedCached > 0 || res.Precise != nil {
			w("| %s | %s | %s |\n", res.Router, fractionCell(res.Precision, res.PredictedCached != 0), preciseCells(res.Precise))
		}
	}
	for i := range r.Results {
		w("%s", cutNote(r.Results[i].Router, r.Results[i].Precise))
	}
}

// cutNote says when the event streams of router's fleet were cut and
// restored, if they were.
func cutNote(router string, p *PreciseResult) string {
	if p == nil || p.EventsCutAfter == 0 {
		return ""
	}
	s := fmt.Sprintf("\n%s: every replica's KV event stream was cut once %d requests had completed", router, p.EventsCutAfter)
	if p.EventsRestoredAfter > 0 {
		s += fmt.Sprintf(", and restored once %d had", p.EventsRestoredAfter)
	}
	return s + ".\n"
}

// preciseMarkdown renders, when a precise kvroute ran, a table of every
// predicting router's precision on each shape beside precise mode's
// figures.
func (r *FamilyReport) preciseMarkdown(w func(format string, args ...any)) {
	if !slices.ContainsFunc(r.Shapes, func(s FamilyShape) bool {
		return slices.ContainsFunc(s.Rows, func(row FamilyRow) bool { return row.Precise != nil })
	}) {
		return
	}
	w("\nPrecise mode: %s\n\n| shape | router | precision | %s |\n| --- | --- | ---: |%s\n", preciseNote, preciseHeader, strings.Repeat(" ---: |", 7))
	for i := range r.Shapes {
		s := &r.Shapes[i]
		for j := range s.Rows {
			if row := &s.Rows[j]; row.PredictedCached > 0 || row.Precise != nil {
				w("| %s | %s | %s | %s |\n", s.Shape, row.Router, fractionCell(row.Precision, row.PredictedCached != 0), preciseCells(row.Precise))
			}
		}
	}
	for i := range r.Shapes {
		for j := range r.Shapes[i].Rows {
			w("%s", cutNote(r.Shapes[i].Shape+" × "+r.Shapes[i].Rows[j].Router, r.Shapes[i].Rows[j].Precise))
		}
	}
}
