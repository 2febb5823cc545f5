package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// The noisy-neighbour benchmark: one tenant (the victim) sends short
// one-shot chats at a steady rate for the whole run; another (the
// aggressor) floods the fleet with the same kind of requests for a while
// in the middle. Each router runs it on its own fresh fleet, and so does
// the victim alone, through kvroute/cache_aware, as the baseline; the
// report splits every router's requests by tenant and divides the
// victim's TTFT p90 during the flood by the same requests' p90 alone.

// NoisyOptions configures the noisy workload (load.Noisy). Rates are in
// requests per simulated second and durations in simulated time; the
// runner scales them to real time, and Options.RateScale multiplies both
// rates.
type NoisyOptions struct {
	// VictimRate is the victim's rate over the whole run; 0:
	// NoisyVictimShare of the fleet's capacity (NoisyCapacity).
	VictimRate float64
	// AggressorRate is the aggressor's rate during the flood; 0: Overload
	// times the fleet's capacity.
	AggressorRate float64
	// Overload is the aggressor's rate as a multiple of the fleet's
	// capacity, when AggressorRate is 0. Default 2.
	Overload float64
	// Warmup is the victim-only time before the flood (default 30s), Flood
	// the aggressor's window (default 60s), Cooldown the victim-only time
	// after it (default 30s).
	Warmup, Flood, Cooldown time.Duration
	// PromptTokens is each request's unique prompt (default 500) and
	// AnswerTokens its max_tokens (default 32).
	PromptTokens, AnswerTokens int
	// Seed makes the workload reproducible. Default 1.
	Seed uint64
}

// NoisyVictimShare is the victim's rate, as a share of the fleet's
// capacity, when NoisyOptions.VictimRate is 0: a light load of its own.
const NoisyVictimShare = 0.1

// The fleet a noisy run uses unless told otherwise (bench's --replicas and
// --time-scale): a flood of a larger fleet, or of a sped-up one, takes
// more requests per real second than one machine sends and serves.
const (
	NoisyReplicas  = 2
	NoisyTimeScale = 1.0
)

// DefaultNoisyOptions returns the noisy workload's defaults.
func DefaultNoisyOptions() NoisyOptions {
	return NoisyOptions{Overload: 2, Warmup: 30 * time.Second, Flood: 60 * time.Second, Cooldown: 30 * time.Second,
		PromptTokens: 500, AnswerTokens: 32, Seed: 1}
}

// withDefaults fills n's zero fields from DefaultNoisyOptions.
func (n NoisyOptions) withDefaults() NoisyOptions {
	d := DefaultNoisyOptions()
	n.Overload = cmp.Or(n.Overload, d.Overload)
	n.Warmup = cmp.Or(n.Warmup, d.Warmup)
	n.Flood = cmp.Or(n.Flood, d.Flood)
	n.Cooldown = cmp.Or(n.Cooldown, d.Cooldown)
	n.PromptTokens = cmp.Or(n.PromptTokens, d.PromptTokens)
	n.AnswerTokens = cmp.Or(n.AnswerTokens, d.AnswerTokens)
	n.Seed = cmp.Or(n.Seed, d.Seed)
	return n
}

// check validates n (after withDefaults).
func (n NoisyOptions) check() error {
	var errs []error
	bad := func(v float64) bool { return v < 0 || math.IsNaN(v) || math.IsInf(v, 0) }
	if bad(n.VictimRate) || bad(n.AggressorRate) {
		errs = append(errs, fmt.Errorf("noisy: the rates must be 0 (derived from the fleet's capacity) or positive, got %v and %v", n.VictimRate, n.AggressorRate))
	}
	if bad(n.Overload) {
		errs = append(errs, fmt.Errorf("noisy: overload must be positive, got %v", n.Overload))
	}
	if n.Warmup < 0 || n.Flood < 0 || n.Cooldown < 0 {
		errs = append(errs, fmt.Errorf("noisy: warm-up, flood and cool-down must not be negative, got %v, %v, %v", n.Warmup, n.Flood, n.Cooldown))
	}
	if n.PromptTokens < 0 || n.AnswerTokens < 0 {
		errs = append(errs, fmt.Errorf("noisy: prompt and answer tokens must not be negative, got %d and %d", n.PromptTokens, n.AnswerTokens))
	}
	return errors.Join(errs...)
}

// FlowOptions is the flow control (config.Flow) a kvroute router runs
// with: the fields the benchmark sets; the rest stay at kvroute's
// defaults.
type FlowOptions struct {
	// MaxWaiting is flow.max_waiting: a replica whose engine has this many
	// requests waiting is saturated. Default 4, so that the engines'
	// queues stay short.
	MaxWaiting int
	// MaxRunning is flow.max_running: a replica whose engine has this
	// many requests running and waiting is saturated for a tenant holding
	// its fair share. Default 0, none.
	MaxRunning int
	// MaxWait is flow.max_wait in simulated time (Kvroute scales it as it
	// scales its other times). Default 10s: far longer than a victim's
	// request waits (about one metrics poll), short enough that a flood's
	// queue stays at a few thousand requests.
	MaxWait time.Duration
	// MaxQueued is flow.max_queued. In Options.Flow, 0 means the number of
	// the workload's requests (at least kvroute's default, 1000), so that
	// the queue is never full and only MaxWait refuses. In Kvroute.Flow,
	// 0 leaves kvroute's defaults of max_queued and max_queued_bytes, and
	// a positive value bounds the queue by that count alone
	// (max_queued_bytes 0, no bound).
	MaxQueued int
	// Tenant is flow.tenant. Default "header:" + load.DefaultTenantHeader,
	// the header the load generator sends Request.Tenant in.
	Tenant string
	// TenantMaxConcurrent is flow.tenant_limits.max_concurrent: the
	// requests each tenant may have in flight. Default 0, none.
	TenantMaxConcurrent int
}

// kvrouteDefaults is kvroute's default configuration, whose
// flow.max_queued and limits.max_inflight the benchmark sizes its queue
// against.
var kvrouteDefaults = config.Default()

// DefaultFlowOptions returns the flow control of NameFlow.
func DefaultFlowOptions() FlowOptions {
	return FlowOptions{MaxWaiting: 4, MaxWait: 10 * time.Second, Tenant: "header:" + load.DefaultTenantHeader}
}

// withDefaults fills f's zero fields (but MaxQueued, and MaxWaiting when
// MaxRunning measures saturation) from DefaultFlowOptions.
func (f FlowOptions) withDefaults() FlowOptions {
	d := DefaultFlowOptions()
	if f.MaxWaiting == 0 && f.MaxRunning == 0 { // saturation measured somehow
		f.MaxWaiting = d.MaxWaiting
	}
	f.MaxWait = cmp.Or(f.MaxWait, d.MaxWait)
	f.Tenant = cmp.Or(f.Tenant, d.Tenant)
	return f
}

// check validates f (after withDefaults).
func (f FlowOptions) check() error {
	if f.MaxWaiting < 0 || f.MaxRunning < 0 || f.MaxWait < 0 || f.MaxQueued < 0 || f.TenantMaxConcurrent < 0 {
		return fmt.Errorf("flow: max waiting, max running, max wait, max queued and the tenants' max concurrent must not be negative, got %d, %d, %v, %d, %d",
			f.MaxWaiting, f.MaxRunning, f.MaxWait, f.MaxQueued, f.TenantMaxConcurrent)
	}
	return nil
}

// forWorkload is f as a router runs it on a workload of n requests:
// MaxQueued 0 becomes n, at least kvroute's default.
func (f FlowOptions) forWorkload(n int) *FlowOptions {
	if f.MaxQueued == 0 {
		f.MaxQueued = max(n, kvrouteDefaults.Flow.MaxQueued)
	}
	return &f
}

// NoisyCapacity is the most one-shot requests per simulated second a
// fleet serves, by the simulator's cost model (sim.Config): every replica
// running full batches in steady state, each step decoding one token of
// every running request and prefilling the requests that replace those
// that finished. It is a bound (a real schedule leaves gaps), used to
// size the noisy workload's rates.
type NoisyCapacity struct {
	// Fleet is the fleet's requests per simulated second; PerReplica one
	// replica's.
	Fleet      float64 `json:"fleet_rps"`
	PerReplica float64 `json:"per_replica_rps"`
	// Batch is the running requests of a full batch: the least of the
	// engine's max_num_seqs, what its KV cache holds and what its token
	// budget per step decodes and prefills.
	Batch int `json:"batch"`
	// StepMs is a full batch's step, in simulated milliseconds.
	StepMs float64 `json:"step_ms"`
}

// noisyCapacity returns the capacity of replicas replicas configured as c
// (complete: sim.PresetConfig) for requests of prompt uncached prompt
// tokens and answer output tokens.
func noisyCapacity(c sim.Config, replicas, prompt, answer int) NoisyCapacity {
	p, a := float64(max(prompt, 1)), float64(max(answer, 1))
	perSeq := (prompt + answer + c.BlockSize - 1) / max(c.BlockSize, 1)
	batch := c.MaxNumSeqs
	if perSeq > 0 {
		batch = min(batch, int(float64(c.NumGPUBlocks)*(1-c.WatermarkFrac))/perSeq)
	}
	// Each step decodes the batch and prefills batch/answer prompts.
	batch = max(min(batch, int(float64(c.MaxBatchedTokens)*a/(a+p))), 1)
	b := float64(batch)
	admitted := b / a // requests finishing, and replaced, per step
	step := c.StepBaseMs + b*c.DecodeSeqMs + c.DecodeCtxMs*b*(p+a/2) +
		admitted*(c.PrefillTokenMs*p+c.PrefillAttnMs*p*p/2)
	per := admitted / step * 1000
	return NoisyCapacity{Fleet: per * float64(replicas), PerReplica: per, Batch: batch, StepMs: step}
}

// noisyPlan is the noisy workload o describes, resolved: the tenants'
// rates in requests per simulated second (RateScale applied) and the
// fleet's capacity they derive from.
type noisyPlan struct {
	victimRate, aggressorRate float64
	capacity                  NoisyCapacity
}

// noisyPlan resolves o's noisy workload (o complete) over replicas
// configured as simCfg.
func (o *Options) noisyPlan(simCfg sim.Config) noisyPlan {
	n := o.Noisy
	p := noisyPlan{capacity: noisyCapacity(simCfg, o.Replicas, n.PromptTokens, n.AnswerTokens)}
	p.victimRate = n.VictimRate
	if p.victimRate == 0 {
		p.victimRate = NoisyVictimShare * p.capacity.Fleet
	}
	p.aggressorRate = n.AggressorRate
	if p.aggressorRate == 0 {
		p.aggressorRate = n.Overload * p.capacity.Fleet
	}
	p.victimRate *= o.RateScale
	p.aggressorRate *= o.RateScale
	return p
}

// loadOptions returns the load.Noisy options of p in real time (rates
// divided by, durations multiplied by o's TimeScale); alone leaves the
// aggressor out.
func (p noisyPlan) loadOptions(o *Options, alone bool) load.NoisyOptions {
	n := o.Noisy
	sc := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.TimeScale) }
	lo := load.NoisyOptions{
		VictimRate: p.victimRate / o.TimeScale, AggressorRate: p.aggressorRate / o.TimeScale,
		Warmup: sc(n.Warmup), Flood: sc(n.Flood), Cooldown: sc(n.Cooldown),
		PromptTokens: n.PromptTokens, MaxTokens: n.AnswerTokens, Seed: n.Seed,
	}
	if alone {
		lo.AggressorRate = 0
	}
	return lo
}

// openStreams estimates the most requests in flight at once through a
// router without flow control: the flood's excess over the fleet's
// capacity piles up in the engines' queues, beside full batches.
func (p noisyPlan) openStreams(o *Options) int {
	excess := max(0, p.victimRate+p.aggressorRate-p.capacity.Fleet) * o.Noisy.Flood.Seconds()
	return int(excess) + p.capacity.Batch*o.Replicas
}

// fdNote warns, when the requests a flood leaves in flight may need more
// file descriptors than this process may open, that the run would lose
// requests to it rather than to the routers; empty otherwise. Each stream
// holds the load generator's connection and the replica's in this
// process, and kvroute's two when it runs here too.
func (p noisyPlan) fdNote(o *Options, limit int) string {
	per := 4
	if o.KvrouteCommand != nil {
		per = 2
	}
	streams := p.openStreams(o)
	if limit <= 0 || streams*per < limit*9/10 {
		return ""
	}
	return fmt.Sprintf("about %d requests may be in flight at once through a router without flow control, %d open files in this process, near or past its limit of %d: "+
		"requests lost to transport errors would be the machine's, not the router's; run kvroute as a process of its own (--kvroute-process), or lower --noisy-overload or --noisy-flood",
		streams, streams*per, limit)
}

// floodWindow is the real-time span of arrivals [start, end) in which
// the noisy workload's aggressor sends; ok is false for other workloads.
func (o *Options) floodWindow() (start, end time.Duration, ok bool) {
	if o.Workload != workloadNoisy {
		return 0, 0, false
	}
	lo := load.NoisyOptions{Warmup: time.Duration(float64(o.Noisy.Warmup) * o.TimeScale), Flood: time.Duration(float64(o.Noisy.Flood) * o.TimeScale)}
	start, end = lo.FloodWindow()
	return start, end, true
}

// TenantResult is one tenant's part of a run: the requests that carried
// it in their tenant header.
type TenantResult struct {
	Tenant string `json:"tenant"`
	// Sent counts the tenant's requests sent and OK those answered in full.
	Sent int `json:"sent"`
	OK   int `json:"ok"`
	// Refused429 and Refused503 count the requests refused with 429 (a
	// tenant limit, or shed from a full queue) and with 503 (a full queue,
	// or flow.max_wait passed).
	Refused429 int `json:"refused_429"`
	Refused503 int `json:"refused_503"`
	// Lost counts the others: no answer, a transport or stream error, a
	// timeout, or any other status.
	Lost int `json:"lost"`
	// LostByKind counts Lost by the sample's error kind.
	LostByKind map[string]int `json:"lost_by_kind,omitempty"`
	// TTFT is over the requests answered in full, in simulated seconds.
	TTFT load.Percentiles `json:"ttft_s"`
	// FloodOK and FloodTTFT are the same over the requests that arrived
	// during the noisy workload's flood (zero for other workloads).
	FloodOK   int              `json:"flood_ok,omitempty"`
	FloodTTFT load.Percentiles `json:"flood_ttft_s"`
}

// tenantResults splits out's samples of w's requests by tenant, in order
// of each tenant's first request; nil when no request has a tenant.
// Times are divided by o's TimeScale; the flood is o's floodWindow.
func tenantResults(w *load.Workload, out *load.Result, o *Options) []TenantResult {
	var tenants []string
	for i := range w.Requests {
		if t := w.Requests[i].Tenant; t != "" && !slices.Contains(tenants, t) {
			tenants = append(tenants, t)
		}
	}
	if len(tenants) == 0 {
		return nil
	}
	start, end, flood := o.floodWindow()
	res := make([]TenantResult, 0, len(tenants))
	for _, t := range tenants {
		sum := out.Filter(func(_ int, s *load.Sample) bool { return s.Tenant == t }).Summarize(0, o.TimeScale)
		tr := TenantResult{Tenant: t, Sent: sum.Requests, OK: sum.OK, TTFT: sum.TTFT}
		for kind, n := range sum.ErrorsByKind {
			switch kind {
			case "http_429":
				tr.Refused429 += n
			case "http_503":
				tr.Refused503 += n
			default:
				tr.Lost += n
				if tr.LostByKind == nil {
					tr.LostByKind = map[string]int{}
				}
				tr.LostByKind[kind] += n
			}
		}
		if flood {
			fs := out.Filter(func(i int, s *load.Sample) bool {
				at := w.Requests[i].At
				return s.Tenant == t && at >= start && at < end
			}).Summarize(0, o.TimeScale)
			tr.FloodOK, tr.FloodTTFT = fs.OK, fs.TTFT
		}
		res = append(res, tr)
	}
	return res
}

// tenant returns the result of tenant t, nil when it sent nothing.
func (res *RouterResult) tenant(t string) *TenantResult {
	for i := range res.Tenants {
		if res.Tenants[i].Tenant == t {
			return &res.Tenants[i]
		}
	}
	return nil
}

// NoisyRun is what a report of the noisy workload holds beside its
// routers' results: the setup and the victim-alone baseline.
type NoisyRun struct {
	// Victim and Aggressor name the tenants.
	Victim    string `json:"victim"`
	Aggressor string `json:"aggressor"`
	// VictimRate and AggressorRate are the tenants' rates, in requests
	// per simulated second, as run.
	VictimRate    float64 `json:"victim_rps"`
	AggressorRate float64 `json:"aggressor_rps"`
	// Capacity is the fleet's capacity by the simulator's cost model;
	// zero for a fleet not simulated here (RunURL).
	Capacity NoisyCapacity `json:"capacity"`
	// Warmup, Flood and Cooldown are the phases, in simulated seconds.
	Warmup   float64 `json:"warmup_s"`
	Flood    float64 `json:"flood_s"`
	Cooldown float64 `json:"cooldown_s"`
	// PromptTokens and AnswerTokens size every request.
	PromptTokens int `json:"prompt_tokens"`
	AnswerTokens int `json:"answer_tokens"`
	// Flow is the flow control of the routers that ran with it (nil when
	// none did): flow.max_waiting, flow.max_wait (simulated seconds),
	// flow.max_queued and flow.tenant.
	Flow *NoisyFlow `json:"flow,omitempty"`
	// Alone is the victim alone (the same victim requests, no aggressor)
	// through kvroute/cache_aware: the baseline; nil for RunURL.
	Alone *RouterResult `json:"alone,omitempty"`
}

// NoisyFlow is the flow control the noisy report names.
type NoisyFlow struct {
	MaxWaiting int     `json:"max_waiting"`
	MaxRunning int     `json:"max_running,omitempty"`
	MaxWait    float64 `json:"max_wait_s"`
	MaxQueued  int     `json:"max_queued"`
	Tenant     string  `json:"tenant"`
}

// newNoisyRun returns the noisy section of a report of o's noisy
// workload, run at plan's rates.
func newNoisyRun(o *Options, plan noisyPlan) *NoisyRun {
	n := o.Noisy
	return &NoisyRun{
		Victim: load.DefaultVictim, Aggressor: load.DefaultAggressor,
		VictimRate: plan.victimRate, AggressorRate: plan.aggressorRate, Capacity: plan.capacity,
		Warmup: n.Warmup.Seconds(), Flood: n.Flood.Seconds(), Cooldown: n.Cooldown.Seconds(),
		PromptTokens: n.PromptTokens, AnswerTokens: n.AnswerTokens,
	}
}

// NameNoisyAlone names the noisy workload's baseline: its victim alone
// through kvroute/cache_aware.
const NameNoisyAlone = "kvroute/cache_aware, victim alone"

// noisyAlone is the baseline of a noisy run: kvroute/cache_aware replaying
// w, the noisy workload without its aggressor, in place of the workload
// the other routers replay.
type noisyAlone struct {
	*Kvroute
	w *load.Workload
}

// Name implements Router.
func (a *noisyAlone) Name() string { return NameNoisyAlone }

// workloadOf is the workload r replays in a run of w: w, but for a
// noisy run's baseline.
func workloadOf(r Router, w *load.Workload) *load.Workload {
	if a, ok := r.(*noisyAlone); ok {
		return a.w
	}
	return w
}

// defaultNoisyRouters are the routers a noisy run compares when none is
// named; nginx is added when it is installed.
var defaultNoisyRouters = []string{router.CacheAwareName, "cache_aware" + flowSuffix}

// runNoisy is runWorkload for the noisy workload w (o complete): the
// victim alone through kvroute/cache_aware first, as the baseline, then
// every router (by default kvroute/cache_aware, kvroute/cache_aware+flow
// and nginx when installed) on the whole workload.
func runNoisy(ctx context.Context, o Options, simCfg sim.Config, w *load.Workload, kind string) (*Report, error) {
	names := o.routerNames()
	var notes []string
	if len(names) == 0 {
		names = slices.Clone(defaultNoisyRouters)
		if _, err := FindBinary(o.NginxPath, "nginx"); err == nil {
			names = append(names, "nginx")
		} else {
			notes = append(notes, fmt.Sprintf("%s skipped: %v", NameNginx, err))
		}
	}
	routers, rnotes, err := ResolveRouters(names, w.HasSessions, o.NginxPath, o.HAProxyPath)
	if err != nil {
		return nil, err
	}
	routers = withSplits(routers, &o)
	plan := o.noisyPlan(simCfg)
	if n := plan.fdNote(&o, openFileLimit()); n != "" {
		notes = append(notes, n)
	}
	alone := load.Noisy(plan.loadOptions(&o, true))
	rep := newReport(&o, simCfg, w, kind)
	rep.Noisy = newNoisyRun(&o, plan)
	for _, r := range routers {
		if k := kvrouteOf(r); k != nil && k.Flow != nil && rep.Noisy.Flow == nil {
			f := o.Flow.forWorkload(len(w.Requests))
			rep.Noisy.Flow = &NoisyFlow{MaxWaiting: f.MaxWaiting, MaxRunning: f.MaxRunning, MaxWait: f.MaxWait.Seconds(), MaxQueued: f.MaxQueued, Tenant: f.Tenant}
		}
	}
	routers = append([]Router{&noisyAlone{Kvroute: &Kvroute{Policy: router.CacheAwareName}, w: alone}}, routers...)
	return runRouters(ctx, rep, o, simCfg, w, routers, append(notes, rnotes...), func(_ Router, res *RouterResult) {
		if o.Notes != nil {
			_, _ = fmt.Fprintln(o.Notes, "  by tenant: "+rep.noisyLine(res))
		}
	})
}

// floodRatio is the victim's TTFT p90 during the flood under res over its
// p90 alone; ok is false when either is unknown.
func (r *Report) floodRatio(res *RouterResult) (ratio float64, ok bool) {
	n := r.Noisy
	if n == nil || n.Alone == nil {
		return 0, false
	}
	v, a := res.tenant(n.Victim), n.Alone.tenant(n.Victim)
	if v == nil || a == nil || v.FloodOK == 0 || a.FloodOK == 0 || a.FloodTTFT.P90 <= 0 {
		return 0, false
	}
	return v.FloodTTFT.P90 / a.FloodTTFT.P90, true
}

// noisyLine sums up a router's noisy run on one line: each tenant's
// answered, refused and lost requests, the victim's TTFT p90 during the
// flood and its ratio to the victim alone.
func (r *Report) noisyLine(res *RouterResult) string {
	parts := make([]string, 0, len(res.Tenants))
	for i := range res.Tenants {
		t := &res.Tenants[i]
		p := fmt.Sprintf("%s %d/%d ok, %d × 429, %d × 503, %d lost", t.Tenant, t.OK, t.Sent, t.Refused429, t.Refused503, t.Lost)
		if r.Noisy != nil && t.Tenant == r.Noisy.Victim && t.FloodOK > 0 {
			p += ", TTFT p90 during the flood " + secs(t.FloodTTFT.P90)
			if x, ok := r.floodRatio(res); ok {
				p += fmt.Sprintf(" (%.2f× alone)", x)
			}
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return "no tenant"
	}
	return strings.Join(parts, "; ")
}

// noisyMarkdown renders the noisy section, when the report has one: the
// setup, a row per router and tenant (the victim alone first), and the
// headline, the victim's TTFT p90 during the flood over alone.
func (r *Report) noisyMarkdown(w func(format string, args ...any)) {
	n := r.Noisy
	if n == nil {
		return
	}
	w("\n### Noisy neighbour\n\n")
	w("Tenant *%s* sends %.1f requests per second for the whole run (%s of warm-up, %s of flood, %s after it); tenant *%s* sends %.1f per second during the flood",
		n.Victim, n.VictimRate, secs(n.Warmup), secs(n.Flood), secs(n.Cooldown), n.Aggressor, n.AggressorRate)
	if c := n.Capacity; c.Fleet > 0 {
		w(", %.1f× the fleet's capacity (%.1f requests per second: %d × %.1f, full batches of %d requests in %.0f ms steps, by the simulator's cost model)",
			n.AggressorRate/c.Fleet, c.Fleet, r.Replicas, c.PerReplica, c.Batch, c.StepMs)
	}
	w(". Every request is a unique prompt of %d tokens answered in %d, its tenant in header %s. ", n.PromptTokens, n.AnswerTokens, load.DefaultTenantHeader)
	if f := n.Flow; f != nil {
		w("The routers named *+flow* run kvroute's flow control: flow.max_waiting %d, ", f.MaxWaiting)
		if f.MaxRunning > 0 {
			w("flow.max_running %d, ", f.MaxRunning)
		}
		w("flow.max_wait %s, flow.max_queued %d (no byte bound: only max_wait refuses), flow.tenant %s. ",
			secs(f.MaxWait), f.MaxQueued, f.Tenant)
	}
	unit := "simulated seconds"
	if r.Target != "" {
		unit = "seconds"
	}
	w("*lost* counts the requests neither answered nor refused with 429 or 503: no answer, a transport or stream error, a timeout, another status. TTFT is over the requests answered, in %s; *flood p90* over those that arrived during the flood", unit)
	if n.Alone != nil {
		w(", and *× alone* divides the victim's by the same requests' when the victim runs alone (%s): what flow control aims to keep at 1.3 or less", NameNoisyAlone)
	}
	w(".\n\n| router | tenant | sent | ok | 429 | 503 | lost | TTFT p50 | TTFT p90 | flood p90 | × alone |\n")
	w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	results := make([]*RouterResult, 0, len(r.Results)+1)
	if n.Alone != nil {
		results = append(results, n.Alone)
	}
	for i := range r.Results {
		results = append(results, &r.Results[i])
	}
	for _, res := range results {
		if len(res.Tenants) == 0 {
			w("| %s | – | – | – | – | – | – | – | – | – | – |\n", res.Router)
			continue
		}
		for i := range res.Tenants {
			t := &res.Tenants[i]
			flood, ratio := "–", "–"
			if t.FloodOK > 0 {
				flood = secs(t.FloodTTFT.P90)
			}
			if t.Tenant == n.Victim {
				if x, ok := r.floodRatio(res); ok {
					ratio = fmt.Sprintf("%.2f", x)
				}
			}
			lost := fmt.Sprint(t.Lost)
			if t.Lost > 0 {
				lost += " (" + sortedKinds(t.LostByKind) + ")"
			}
			w("| %s | %s | %d | %d | %d | %d | %s | %s | %s | %s | %s |\n", res.Router, t.Tenant, t.Sent, t.OK, t.Refused429, t.Refused503, lost,
				secs(t.TTFT.P50), secs(t.TTFT.P90), flood, ratio)
		}
	}
	var lines []string
	for _, res := range results {
		if res != n.Alone {
			if x, ok := r.floodRatio(res); ok {
				lines = append(lines, fmt.Sprintf("%s %.2f×", res.Router, x))
			}
		}
	}
	if len(lines) > 0 {
		w("\nThe victim's TTFT p90 during the flood over its p90 alone: %s.\n", strings.Join(lines, ", "))
	}
	w("\n")
	for _, res := range results {
		w("- %s: %s\n", res.Router, r.noisyLine(res))
	}
}
