package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
)

// Report is the result of a benchmark: the setup and one RouterResult per
// router, in the order they ran.
type Report struct {
	// Target is the base URL the workload was replayed against by RunURL,
	// in real time; empty for a comparison of routers over simulated
	// fleets (Run), whose fleet fields below it leaves zero.
	Target string `json:"target,omitempty"`
	// Workload is the workload's description, WorkloadKind its generator.
	Workload     string `json:"workload"`
	WorkloadKind string `json:"workload_kind"`
	// Requests is the number of requests of the workload; PromptTokens
	// their total prompt length.
	Requests     int   `json:"requests"`
	PromptTokens int64 `json:"prompt_tokens"`
	HasSessions  bool  `json:"has_sessions"`
	// IdealHitRate is the workload's prefix-cache hit rate on one server
	// with an infinite cache (load.IdealHitRate at the replicas' block size).
	IdealHitRate float64 `json:"ideal_hit_rate"`
	// Oracle holds the ideal and the finite-cache bound on the same arrival
	// order and fleet; nil for a RunURL report, whose fleet is not known.
	Oracle *Oracle `json:"oracle,omitempty"`
	// Fleet: replicas per router, their preset, model and block size.
	Replicas  int    `json:"replicas"`
	Preset    string `json:"preset"`
	Model     string `json:"model"`
	BlockSize int    `json:"block_size"`
	// TimeScale and RateScale as run; reported times are divided by TimeScale.
	TimeScale float64 `json:"time_scale"`
	RateScale float64 `json:"rate_scale"`
	// TTFTTarget is the goodput bound in unscaled seconds.
	TTFTTarget float64 `json:"ttft_target_s"`
	// Started is when the benchmark began; Wall its real duration in seconds.
	Started time.Time `json:"started"`
	Wall    float64   `json:"wall_s"`
	// Host describes the machine: GOOS/GOARCH and logical CPUs.
	Host string `json:"host"`
	// Notes records routers skipped or failed.
	Notes   []string       `json:"notes,omitempty"`
	Results []RouterResult `json:"results"`
	// Instances compares the numbers of kvroute instances of
	// Options.Instances (one Results entry per number); nil otherwise.
	Instances *InstancesRun `json:"instances,omitempty"`
	// Noisy is the noisy workload's setup and baseline (the victim
	// alone); nil for the other workloads.
	Noisy *NoisyRun `json:"noisy,omitempty"`
}

// RouterResult is what one router achieved on its own fresh fleet.
type RouterResult struct {
	// Router is the router's name.
	Router string `json:"router"`
	// Error is set when the router could not be started or the run failed;
	// the other fields are then partial or zero.
	Error string `json:"error,omitempty"`
	// Summary is the load generator's view, in unscaled time.
	Summary load.Summary `json:"summary"`
	// Tenants splits the requests by tenant (load.Request.Tenant), in
	// order of each tenant's first request; nil when none has one.
	Tenants []TenantResult `json:"tenants,omitempty"`
	// HitRate is the replicas' own prefix-cache hit rate: the sum of their
	// hit tokens over the sum of their queried tokens. Hit tokens count
	// every tier a prompt's prefix was reused from (GPU, and host memory
	// when the preset has an offload tier); HostHitTokens is the host
	// tier's part.
	HitRate       float64 `json:"replica_hit_rate"`
	HitTokens     int64   `json:"hit_tokens"`
	HostHitTokens int64   `json:"host_hit_tokens,omitempty"`
	// TransferTokens are the prompt tokens decode replicas received from
	// prefill replicas (a disaggregated fleet), counted in neither the
	// queried nor the hit tokens.
	TransferTokens int64 `json:"transfer_tokens,omitempty"`
	// PrefillBound is, for a split fleet, the finite-cache bound's hit
	// rate over its prefill replicas' caches alone, which its OfBound is
	// against.
	PrefillBound float64 `json:"prefill_bound,omitempty"`
	QueryTokens  int64   `json:"query_tokens"`
	// OfBound and OfIdeal are HitTokens as a fraction of the hit tokens of
	// Report.Oracle's bound and ideal (0 without an oracle).
	OfBound float64 `json:"hits_of_bound"`
	OfIdeal float64 `json:"hits_of_ideal"`
	// OfPooled is HitTokens as a fraction of Report.Oracle's pooled bound
	// (0 without one).
	OfPooled float64 `json:"hits_of_pooled,omitempty"`
	// PredictedCached and EngineCached are the router's predicted cached
	// tokens and the engines' reports (usage.prompt_tokens_details), over
	// the requests whose engine reported them; Precision is the second
	// over the first. Zero for routers that do not predict (nginx).
	PredictedCached int64 `json:"predicted_cached_tokens,omitempty"`
	EngineCached    int64 `json:"engine_cached_tokens,omitempty"`
	// Reuse is kvroute's split of the engines' prompt tokens
	// (kvroute_reuse_tokens_total) by kind: delivered, routing_loss,
	// index_loss, workload_miss; nil for another router.
	Reuse     map[string]int64 `json:"reuse_tokens,omitempty"`
	Precision float64          `json:"precision,omitempty"`
	// Precise is what precise mode did, for a precise kvroute
	// (NamePrecise); nil for every other router.
	Precise *PreciseResult `json:"precise,omitempty"`
	// Routes counts the router's decisions by kind, from the
	// X-Kvroute-Route of its answers; nil for routers other than kvroute.
	Routes []RouteCount `json:"routes,omitempty"`
	// PinnedShare is the share of the replicas' GPU cache blocks that
	// running requests held, time-weighted over the run and averaged over
	// the replicas: blocks no prefix could stay cached in, which the
	// finite-cache bound does not model. PinnedBound is the bound over
	// caches that much smaller, and OfPinnedBound HitTokens as a fraction
	// of its hit tokens (all zero for a fleet not simulated here).
	PinnedShare   float64       `json:"pinned_share,omitempty"`
	PinnedBound   *OracleFigure `json:"pinned_bound,omitempty"`
	OfPinnedBound float64       `json:"hits_of_pinned_bound,omitempty"`
	// OwnPlacement is the router's own placement (the replica that
	// answered each request, from X-Kvroute-Backend) replayed over the
	// finite-cache bound's caches, and OwnPlacementOfBound its hit tokens
	// as a fraction of the bound's: what the router's choices alone would
	// reuse where only placement fills the caches. Nil for routers that do
	// not name the replica (nginx, HAProxy).
	OwnPlacement        *OracleFigure `json:"own_placement,omitempty"`
	OwnPlacementOfBound float64       `json:"own_placement_of_bound,omitempty"`
	// ArrivalHeldTokens sums, over the requests, the prompt tokens their
	// replica held of each as it arrived, ArrivalBestTokens the most any
	// replica held then, and HeldOfBest is the first over the second:
	// what the router's choices found of what the replicas' real caches
	// offered (1 − HeldOfBest is what they gave up there, on purpose, a
	// prefix replicated or a turn moved off a loaded replica, or for want
	// of knowing it). Zero for a fleet not simulated here.
	ArrivalHeldTokens int64   `json:"arrival_held_tokens,omitempty"`
	ArrivalBestTokens int64   `json:"arrival_best_tokens,omitempty"`
	HeldOfBest        float64 `json:"held_of_best,omitempty"`
	// placement is the replica index that answered each request (-1 for
	// none known), and placed how many are known.
	placement []int
	placed    int
	// PrefillTokens is the fleet's total prefill work (tokens computed).
	PrefillTokens int64 `json:"prefill_tokens"`
	// RequestImbalance and PrefillImbalance are the max/mean ratio over
	// replicas of requests and of prefill tokens (1 is perfectly even; the
	// number of replicas means one replica did everything).
	RequestImbalance float64 `json:"request_max_mean"`
	PrefillImbalance float64 `json:"prefill_max_mean"`
	// Replicas is each replica's share.
	Replicas []ReplicaShare `json:"replicas"`
	// TTFTCDF is the TTFT distribution as {seconds, fraction} points.
	TTFTCDF [][2]float64 `json:"ttft_cdf"`
	// Wall is the run's real duration in seconds, setup included.
	Wall float64 `json:"wall_s"`
}

// ReplicaShare is one replica's counters after a run.
type ReplicaShare struct {
	Name          string  `json:"name"`
	Requests      int64   `json:"requests"`
	RequestShare  float64 `json:"request_share"`
	PrefillTokens int64   `json:"prefill_tokens"`
	PrefillShare  float64 `json:"prefill_share"`
	HitTokens     int64   `json:"hit_tokens"`
	QueryTokens   int64   `json:"query_tokens"`
	Preemptions   int64   `json:"preemptions"`
}

// Run runs the benchmark o describes: it builds the workload, then for each
// router starts a fresh fleet, starts the router in front of it, replays the
// workload through it and records the result. A router that fails to start
// is recorded with its error and the benchmark goes on. When o.Out is set the
// report files are written there (see Report.WriteFiles). If ctx ends, Run
// returns the routers finished so far with ctx's error.
func Run(ctx context.Context, o Options) (*Report, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	simCfg, err := o.simConfig()
	if err != nil {
		return nil, err
	}
	w, err := BuildWorkload(o)
	if err != nil {
		return nil, err
	}
	return runWorkload(ctx, o, simCfg, w, o.Workload)
}

// runWorkload is Run on the built workload w, of generator kind, with o
// complete (withDefaults) and its replicas configured as simCfg.
func runWorkload(ctx context.Context, o Options, simCfg sim.Config, w *load.Workload, kind string) (*Report, error) {
	if len(o.Instances) > 0 {
		return runInstances(ctx, o, simCfg, w, kind)
	}
	if kind == workloadNoisy {
		return runNoisy(ctx, o, simCfg, w, kind)
	}
	routers, notes, err := ResolveRouters(o.routerNames(), w.HasSessions, o.NginxPath, o.HAProxyPath)
	if err != nil {
		return nil, err
	}
	routers = withSplits(routers, &o)
	return runRouters(ctx, newReport(&o, simCfg, w, kind), o, simCfg, w, routers, notes, nil)
}

// newReport returns the report of w, of generator kind, run as o and
// simCfg say, with no result yet.
func newReport(o *Options, simCfg sim.Config, w *load.Workload, kind string) *Report {
	oracle := computeOracle(w, o.Replicas, simCfg)
	rep := workloadReport(o, w, kind, simCfg.Model, simCfg.BlockSize)
	rep.Oracle, rep.Replicas, rep.Preset = oracle, o.Replicas, o.Preset
	return rep
}

// workloadReport returns the report of w, of generator kind, sent to
// model as o says and keyed in blocks of blockSize tokens, started now,
// with no result yet: what newReport and RunURL share.
func workloadReport(o *Options, w *load.Workload, kind, model string, blockSize int) *Report {
	rep := &Report{
		Workload:     w.Name,
		WorkloadKind: kind,
		Requests:     len(w.Requests),
		HasSessions:  w.HasSessions,
		IdealHitRate: load.IdealHitRate(w, blockSize),
		Model:        model,
		BlockSize:    blockSize,
		TimeScale:    o.TimeScale,
		RateScale:    o.RateScale,
		TTFTTarget:   o.TTFTTarget.Seconds(),
		Started:      time.Now().UTC().Truncate(time.Second),
		Host:         fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
	}
	for i := range w.Requests {
		rep.PromptTokens += int64(w.Requests[i].PromptTokens)
	}
	return rep
}

// runRouters runs w through each of routers into rep (notes are notes
// already taken), calling done, when not nil, after each router's result
// is in rep.Results and its line in o.Notes, writes the report files into
// o.Out when set, and returns rep, or nil if o.Out cannot be made. If ctx
// ends, it stops after the router running and returns rep with ctx's
// error. A noisyAlone among routers replays its own workload, unscored,
// into rep.Noisy.Alone.
func runRouters(ctx context.Context, rep *Report, o Options, simCfg sim.Config, w *load.Workload, routers []Router, notes []string,
	done func(r Router, res *RouterResult)) (*Report, error) {
	note := func(s string) {
		rep.Notes = append(rep.Notes, s)
		if o.Notes != nil {
			_, _ = fmt.Fprintln(o.Notes, s)
		}
	}
	for _, n := range notes {
		note(n)
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, err
		}
	}
	for _, r := range routers {
		if k := kvrouteOf(r); k != nil {
			if k.Flow != nil {
				k.Flow = o.Flow.forWorkload(len(workloadOf(r, w).Requests))
			}
			if k.TimeScale == 0 {
				k.TimeScale = o.TimeScale
			}
			if k.RenderTimeout == 0 {
				k.RenderTimeout = o.PreciseRenderTimeout
			}
			if k.Command == nil {
				k.Command = o.KvrouteCommand
			}
			if k.CacheTokens == 0 && simCfg.HostBlocks > 0 {
				// An offload tier is invisible in vLLM's metrics: an operator
				// states the capacity in cache_tokens, and so does the bench.
				k.CacheTokens = int64(simCfg.NumGPUBlocks+simCfg.HostBlocks) * int64(simCfg.BlockSize)
			}
		}
	}

	var total int64
	for _, r := range routers {
		total += int64(len(workloadOf(r, w).Requests))
	}
	bar := newBar(o.Progress, total)
	start := time.Now()
	var runErr error
	prefillOracles := map[int]*Oracle{} // the bounds of split fleets' prefill pools, by size
	publish := slices.ContainsFunc(routers, isPrecise)
	for i, r := range routers {
		bar.describe(fmt.Sprintf("[%d/%d] %-20s", i+1, len(routers), r.Name()))
		res := runOne(ctx, r, workloadOf(r, w), &o, simCfg, publish, bar)
		var got *RouterResult
		if _, ok := r.(*noisyAlone); ok && rep.Noisy != nil {
			// Another workload than the report's: no oracle to score it by.
			rep.Noisy.Alone = &res
			got = rep.Noisy.Alone
		} else if k, ok := r.(*Kvroute); ok && k.Roles != nil && rep.Oracle != nil {
			// A split fleet's hits are its prefill replicas': scored
			// against the bound of that many caches. (The answering
			// replica is a decode one: no placement replay.)
			p := prefillReplicas(k.Roles)
			if prefillOracles[p] == nil {
				prefillOracles[p] = computeOracle(w, p, simCfg)
			}
			res.scoreAgainst(prefillOracles[p])
			res.PrefillBound = prefillOracles[p].Bound.HitRate
		} else {
			res.scoreAgainst(rep.Oracle)
			res.scorePinned(rep.Oracle, w, o.Replicas, simCfg)
			res.scorePlacement(rep.Oracle, w, o.Replicas, simCfg)
		}
		if got == nil {
			rep.Results = append(rep.Results, res)
			got = &rep.Results[len(rep.Results)-1]
		}
		bar.clear()
		if res.Error != "" {
			note(fmt.Sprintf("%s: %s", r.Name(), res.Error))
		} else if o.Notes != nil {
			s := res.Summary
			_, _ = fmt.Fprintf(o.Notes, "%s: %d/%d ok, replica hit rate %s, TTFT p50 %s p90 %s (%.1fs)\n", r.Name(), s.OK, s.Requests,
				pct(res.HitRate), secs(s.TTFT.P50), secs(s.TTFT.P90), res.Wall)
		}
		if done != nil {
			done(r, got)
		}
		if err := ctx.Err(); err != nil {
			runErr = err
			break
		}
	}
	bar.finish()
	rep.Wall = time.Since(start).Seconds()
	if o.Out != "" {
		if err := rep.WriteFiles(o.Out); err != nil {
			return rep, errors.Join(runErr, err)
		}
	}
	return rep, runErr
}

// runOne runs w through r on a fresh fleet, whose replicas publish KV
// events when publish is set or r is precise (fleetConfig).
func runOne(ctx context.Context, r Router, w *load.Workload, o *Options, simCfg sim.Config, publish bool, bar *bar) (res RouterResult) {
	res.Router = r.Name()
	t0 := time.Now()
	defer func() { res.Wall = time.Since(t0).Seconds() }()
	fail := func(err error) RouterResult {
		res.Error = err.Error()
		return res
	}
	var fleet *sim.Fleet
	var err error
	if k, ok := r.(*Kvroute); ok && k.Roles != nil {
		fleet, err = sim.StartRoleFleet(ctx, k.Roles, 0, fleetConfig(r, simCfg, publish))
	} else {
		fleet, err = sim.StartFleet(ctx, o.Replicas, 0, fleetConfig(r, simCfg, publish))
	}
	if err != nil {
		return fail(fmt.Errorf("fleet: %w", err))
	}
	defer fleet.Close()
	dir, err := os.MkdirTemp("", "kvroute-bench-")
	if err != nil {
		return fail(err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// Keep the router's configuration and logs next to the results.
	if o.Out != "" {
		defer keepFiles(dir, filepath.Join(o.Out, "routers", strings.ReplaceAll(r.Name(), "/", "_")))
	}
	inst, err := startRouter(ctx, r, fleet, dir)
	if err != nil {
		return fail(fmt.Errorf("start: %w", err))
	}
	// The explicit Stop below records its error; this one covers early returns.
	defer func() { _ = inst.Stop() }()

	out, err := load.Run(ctx, inst.URL(), w, load.RunOptions{
		Model:   simCfg.Model,
		Timeout: o.requestTimeout(),
		OnDone:  onDone(inst, fleet, len(w.Requests), o.PreciseCutEvents, bar),
	})
	if cr, ok := inst.(cacheReporter); ok {
		res.PredictedCached, res.EngineCached = cr.CachedTokens()
		res.Precision = ratio(res.EngineCached, res.PredictedCached)
	}
	if rr, ok := inst.(reuseReporter); ok {
		res.Reuse = rr.ReuseTokens()
	}
	if ki, ok := inst.(*kvrouteInstance); ok && ki.precise {
		var perr error
		if res.Precise, perr = ki.preciseResult(out); perr != nil {
			res.Error = "precise: " + perr.Error()
		}
	}
	if err := inst.Stop(); err != nil && res.Error == "" {
		res.Error = "stop: " + err.Error()
	}
	if out == nil {
		return fail(err)
	}
	if err != nil {
		res.Error = err.Error()
	}
	res.Summary = out.Summarize(o.TTFTTarget, o.TimeScale)
	res.TTFTCDF = out.TTFTCDF(200, o.TimeScale)
	res.Routes = routeCounts(out.Samples)
	res.Tenants = tenantResults(w, out, o)
	res.fillReplicas(fleet, float64(out.Wall)/float64(time.Millisecond)/o.TimeScale)
	names := make([]string, len(res.Replicas))
	for i := range res.Replicas {
		names[i] = res.Replicas[i].Name
	}
	res.recordPlacement(out.Samples, names)
	return res
}

// fillReplicas records the fleet's counters after a run of simMS
// simulated milliseconds.
func (res *RouterResult) fillReplicas(fleet *sim.Fleet, simMS float64) {
	var reqs, maxReq, maxPrefill int64
	for _, rp := range fleet.Replicas {
		st := rp.Stats()
		res.Replicas = append(res.Replicas, ReplicaShare{
			Name: st.Name, Requests: st.Requests, PrefillTokens: st.PrefillTokens,
			HitTokens: st.ReuseHitTokens(), QueryTokens: st.QueryTokens, Preemptions: st.Preemptions,
		})
		reqs += st.Requests
		res.PrefillTokens += st.PrefillTokens
		res.HitTokens += st.ReuseHitTokens()
		res.HostHitTokens += st.HostHitTokens
		res.TransferTokens += st.TransferTokens
		res.QueryTokens += st.QueryTokens
		maxReq = max(maxReq, st.Requests)
		maxPrefill = max(maxPrefill, st.PrefillTokens)
		if st.NumBlocks > 0 && simMS > 0 {
			res.PinnedShare += st.PinnedBlockMS / (float64(st.NumBlocks) * simMS) / float64(len(fleet.Replicas))
		}
		res.ArrivalHeldTokens += st.ArrivalHeldTokens
		res.ArrivalBestTokens += st.ArrivalBestTokens
	}
	res.HeldOfBest = ratio(res.ArrivalHeldTokens, res.ArrivalBestTokens)
	n := float64(len(res.Replicas))
	for i := range res.Replicas {
		s := &res.Replicas[i]
		s.RequestShare = ratio(s.Requests, reqs)
		s.PrefillShare = ratio(s.PrefillTokens, res.PrefillTokens)
	}
	res.HitRate = ratio(res.HitTokens, res.QueryTokens)
	if reqs > 0 {
		res.RequestImbalance = float64(maxReq) * n / float64(reqs)
	}
	if res.PrefillTokens > 0 {
		res.PrefillImbalance = float64(maxPrefill) * n / float64(res.PrefillTokens)
	}
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// keepFiles copies the configuration and log files of src into dst, and
// those of its subdirectories into dst's.
func keepFiles(src, dst string) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.IsDir() {
			keepFiles(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
			continue
		}
		switch filepath.Ext(e.Name()) {
		case ".conf", ".cfg", ".yaml", ".log":
		default:
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			continue
		}
		if os.MkdirAll(dst, 0o755) == nil {
			_ = os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644)
		}
	}
}

// bar is an optional progress bar; its methods do nothing when it is nil.
type bar struct {
	pb *progressbar.ProgressBar
	w  io.Writer
}

func newBar(w io.Writer, total int64) *bar {
	if w == nil {
		return nil
	}
	return &bar{w: w, pb: progressbar.NewOptions64(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionShowIts(),
		progressbar.OptionClearOnFinish(),
	)}
}

func (b *bar) describe(s string) {
	if b != nil {
		b.pb.Describe(s)
	}
}

func (b *bar) add() {
	if b != nil {
		_ = b.pb.Add(1)
	}
}

// clear erases the bar so a line can be printed; the next add redraws it.
func (b *bar) clear() {
	if b != nil {
		_ = b.pb.Clear()
	}
}

func (b *bar) finish() {
	if b != nil {
		_ = b.pb.Finish()
	}
}
