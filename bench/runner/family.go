package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/router"
)

// The shapes of the workload family, in the order RunFamily runs them.
const (
	ShapeTenants    = "tenants"
	ShapeAgentic    = "agentic"
	ShapeFewShot    = "fewshot"
	ShapeRAG        = "rag"
	ShapeHotPrefix  = "hotprefix"
	ShapeNoReuse    = "noreuse"
	ShapeSequential = "sequential"
	ShapeBursts     = "bursts"
	ShapeMooncake   = "mooncake"
	ShapeAzure      = "azure"
)

// Shapes lists every shape of the family; mooncake and azure need their
// traces (FamilyOptions.MooncakeTrace, AzureTrace) and are skipped with a
// note without them.
var Shapes = []string{ShapeTenants, ShapeAgentic, ShapeFewShot, ShapeRAG, ShapeHotPrefix, ShapeNoReuse,
	ShapeSequential, ShapeBursts, ShapeMooncake, ShapeAzure}

// Family report file names inside the output directory; each shape's own
// report (Report.WriteFiles) goes into a subdirectory named after it.
const (
	FileFamilyMarkdown = "family.md"
	FileFamilyJSON     = "family.json"
)

// FamilyOptions configures RunFamily.
type FamilyOptions struct {
	// Options holds the fleet (Replicas, Preset, Model, TimeScale,
	// StreamFlushInterval), the routers (empty: DefaultFamilyRouters), the
	// load (RateScale), TTFTTarget, RequestTimeout, the nginx and HAProxy
	// binaries, Out, Progress and Notes. Its workload fields are unused.
	Options
	// Seed seeds every synthetic shape.
	Seed uint64
	// Scale multiplies the size of every shape: its sessions, requests or
	// bursts, and below 1 its turns too (at least 3). Default 1: a few
	// hundred requests per shape.
	Scale float64
	// Shapes names the shapes to run (a subset of Shapes, in any order; run
	// in the order of Shapes); empty runs them all.
	Shapes []string
	// MooncakeTrace is the Mooncake conversation trace and AzureTrace an
	// Azure LLM inference trace CSV; a shape whose trace is empty is
	// skipped with a note.
	MooncakeTrace, AzureTrace string
	// Heavy runs each shape at its heavy point (HeavyLoads): its own size,
	// arrival rate and time scale, replacing Scale, RateScale and
	// TimeScale, which must then be left at their defaults.
	Heavy bool
}

// FamilyLoad is the load a shape ran at: its size scale, rate scale and
// time scale.
type FamilyLoad struct {
	Scale     float64 `json:"scale"`
	RateScale float64 `json:"rate_scale"`
	TimeScale float64 `json:"time_scale"`
}

// String is the load as the family table shows it.
func (l FamilyLoad) String() string {
	return fmt.Sprintf("× %g, rate × %g, time scale %g", l.Scale, l.RateScale, l.TimeScale)
}

// HeavyLoads is each shape's heavy point: a load at which nginx
// round-robin's TTFT p90 was above 5 s (8 × llama-8b-h100 replicas; the
// figures are in docs/benchmarks.md). Time scale 1 where the router's own CPU time
// would otherwise be magnified, 0.1 where a shape's think times or trace
// span minutes. sequential has none: one request is in flight at a time
// whatever its size, so it runs at its default load.
var HeavyLoads = map[string]FamilyLoad{
	ShapeTenants:   {Scale: 32, RateScale: 200, TimeScale: 1},
	ShapeAgentic:   {Scale: 3, RateScale: 10, TimeScale: 0.1},
	ShapeFewShot:   {Scale: 8, RateScale: 100, TimeScale: 1},
	ShapeRAG:       {Scale: 8, RateScale: 100, TimeScale: 1},
	ShapeHotPrefix: {Scale: 4, RateScale: 40, TimeScale: 1},
	ShapeNoReuse:   {Scale: 8, RateScale: 100, TimeScale: 1},
	ShapeBursts:    {Scale: 8, RateScale: 200, TimeScale: 1},
	ShapeMooncake:  {Scale: 10, RateScale: 1.6, TimeScale: 0.1},
	ShapeAzure:     {Scale: 8, RateScale: 100, TimeScale: 1},
}

// DefaultFamilyRouters are the routers RunFamily compares by default;
// nginx is added when it is installed.
var DefaultFamilyRouters = []string{router.CacheAwareName, router.LeastLoadName, router.RoundRobinName}

// FamilyReport is the result of RunFamily: one FamilyShape per shape run.
type FamilyReport struct {
	Replicas  int     `json:"replicas"`
	Preset    string  `json:"preset"`
	BlockSize int     `json:"block_size"`
	TimeScale float64 `json:"time_scale"`
	RateScale float64 `json:"rate_scale"`
	Scale     float64 `json:"scale"`
	// Heavy says each shape ran at its own heavy point (FamilyShape.Load).
	Heavy bool `json:"heavy,omitempty"`
	// Instances are the numbers of kvroute instances each shape ran
	// through (Options.Instances), in place of routers; nil when none.
	Instances []int `json:"instances,omitempty"`
	// Disaggregated are the fleet splits every kvroute router also ran
	// in front of (Options.Disaggregated), in the protocol Protocol.
	Disaggregated []string  `json:"disaggregated,omitempty"`
	Protocol      string    `json:"disaggregation_protocol,omitempty"`
	Seed          uint64    `json:"seed"`
	Started       time.Time `json:"started"`
	Wall          float64   `json:"wall_s"`
	Host          string    `json:"host"`
	// Notes records shapes skipped and routers failed.
	Notes  []string      `json:"notes,omitempty"`
	Shapes []FamilyShape `json:"shapes"`
}

// FamilyShape is one shape's workload, its oracle and every router's row.
type FamilyShape struct {
	Shape string `json:"shape"`
	// Load is the shape's own load when the family ran heavy (nil: the
	// report's scales).
	Load         *FamilyLoad `json:"load,omitempty"`
	Workload     string      `json:"workload"`
	Requests     int         `json:"requests"`
	PromptTokens int64       `json:"prompt_tokens"`
	Oracle       *Oracle     `json:"oracle"`
	Rows         []FamilyRow `json:"rows"`
}

// FamilyRow is one router on one shape.
type FamilyRow struct {
	Router string `json:"router"`
	// Error is the router's failure, if any.
	Error string `json:"error,omitempty"`
	// OfBound and OfIdeal are the router's hit tokens as a fraction of the
	// finite-cache bound's (b) and of the ideal's (a); HitRate is the
	// replicas' own hit rate.
	OfBound float64 `json:"hits_of_bound"`
	OfIdeal float64 `json:"hits_of_ideal"`
	HitRate float64 `json:"replica_hit_rate"`
	// OwnPlacementOfBound is as in RouterResult: the router's own
	// placement replayed over the bound's caches, as a fraction of the
	// bound's hits; 0 for a router that names no replica.
	OwnPlacementOfBound float64 `json:"own_placement_of_bound,omitempty"`
	// HeldOfBest is as in RouterResult: the prompt tokens each request's
	// replica held as it arrived, as a fraction of the most any replica
	// held then.
	HeldOfBest float64 `json:"held_of_best,omitempty"`
	// TTFTP50, TTFTP90 and TPOTP90 (time per output token after the
	// first) are in simulated seconds.
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	TPOTP90 float64 `json:"tpot_p90_s"`
	// PrefillImbalance is the busiest replica's prefill tokens over the mean.
	PrefillImbalance float64 `json:"prefill_max_mean"`
	Requests         int     `json:"requests"`
	OK               int     `json:"ok"`
	Errors           int     `json:"errors"`
	// PredictedCached, EngineCached and Precision are as in RouterResult
	// (zero for a router that does not predict); Precise is what precise
	// mode did, for the precise kvroute only.
	PredictedCached int64          `json:"predicted_cached_tokens,omitempty"`
	EngineCached    int64          `json:"engine_cached_tokens,omitempty"`
	Precision       float64        `json:"precision,omitempty"`
	Precise         *PreciseResult `json:"precise,omitempty"`
	// Summary is the load generator's full view.
	Summary load.Summary `json:"summary"`
}

// RunFamily runs every shape of the family through the routers, each shape
// as Run would run one workload (a fresh fleet per router, each shape's own
// report files under Out/<shape>), and gathers one table: rows shape ×
// router. A shape that cannot be built is skipped with a note. When Out is
// set, family.md and family.json are written there. If ctx ends, RunFamily
// returns the shapes finished so far with ctx's error.
func RunFamily(ctx context.Context, f FamilyOptions) (*FamilyReport, error) {
	o, err := f.withDefaults()
	if err != nil {
		return nil, err
	}
	if f.Scale == 0 {
		f.Scale = 1
	}
	if f.Scale < 0 || math.IsNaN(f.Scale) {
		return nil, fmt.Errorf("family scale must be positive, got %v", f.Scale)
	}
	if f.Heavy && (f.Scale != 1 || o.RateScale != 1 || o.TimeScale != DefaultOptions().TimeScale) {
		return nil, errors.New("a heavy family sets each shape's size, rate scale and time scale: leave scale, rate scale and time scale at their defaults")
	}
	for _, s := range f.Shapes {
		if !slices.Contains(Shapes, s) {
			return nil, fmt.Errorf("shape %q: want one of %s", s, strings.Join(Shapes, ", "))
		}
	}
	if len(o.Routers) == 0 && len(o.Instances) == 0 {
		o.Routers = slices.Clone(DefaultFamilyRouters)
		if _, err := FindBinary(o.NginxPath, "nginx"); err == nil {
			o.Routers = append(o.Routers, "nginx")
		}
	}
	simCfg, err := o.simConfig()
	if err != nil {
		return nil, err
	}
	rep := &FamilyReport{
		Replicas: o.Replicas, Preset: o.Preset, BlockSize: simCfg.BlockSize, TimeScale: o.TimeScale, RateScale: o.RateScale,
		Scale: f.Scale, Heavy: f.Heavy, Instances: o.Instances, Disaggregated: o.Disaggregated, Seed: f.Seed,
		Protocol: disaggregationProtocol(&o), Started: time.Now().UTC().Truncate(time.Second),
		Host: fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()),
	}
	note := func(s string) {
		rep.Notes = append(rep.Notes, s)
		if o.Notes != nil {
			_, _ = fmt.Fprintln(o.Notes, s)
		}
	}
	start := time.Now()
	out := o.Out
	var runErr error
	for _, shape := range Shapes {
		if len(f.Shapes) > 0 && !slices.Contains(f.Shapes, shape) {
			continue
		}
		so, sf, shapeCfg := o, f, simCfg
		var heavy *FamilyLoad
		if l, ok := HeavyLoads[shape]; ok && f.Heavy {
			heavy = &l
			sf.Scale, so.RateScale, so.TimeScale = l.Scale, l.RateScale, l.TimeScale
			if shapeCfg, err = so.simConfig(); err != nil {
				return nil, err
			}
		} else if f.Heavy {
			note(fmt.Sprintf("%s: no heavy point (one request in flight at a time): run at its default load", shape))
		}
		w, err := sf.build(shape, &so)
		if err != nil {
			note(fmt.Sprintf("%s: skipped: %v", shape, err))
			continue
		}
		so.Out = ""
		if out != "" {
			so.Out = filepath.Join(out, shape)
		}
		r, err := runWorkload(ctx, so, shapeCfg, w, shape)
		if r != nil {
			fs := familyShape(shape, r)
			fs.Load = heavy
			rep.Shapes = append(rep.Shapes, fs)
			for _, n := range r.Notes { // already printed by runWorkload
				rep.Notes = append(rep.Notes, shape+": "+n)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				runErr = err
				break
			}
			note(fmt.Sprintf("%s: %v", shape, err))
		}
	}
	rep.Wall = time.Since(start).Seconds()
	if out != "" {
		if err := rep.WriteFiles(out); err != nil {
			return rep, errors.Join(runErr, err)
		}
	}
	return rep, runErr
}

// familyShape condenses a shape's report into its rows.
func familyShape(shape string, r *Report) FamilyShape {
	fs := FamilyShape{Shape: shape, Workload: r.Workload, Requests: r.Requests, PromptTokens: r.PromptTokens, Oracle: r.Oracle}
	for i := range r.Results {
		res := &r.Results[i]
		s := res.Summary
		fs.Rows = append(fs.Rows, FamilyRow{
			Router: res.Router, Error: res.Error, OfBound: res.OfBound, OfIdeal: res.OfIdeal, HitRate: res.HitRate,
			TTFTP50: s.TTFT.P50, TTFTP90: s.TTFT.P90, TPOTP90: s.TPOT.P90, PrefillImbalance: res.PrefillImbalance, OwnPlacementOfBound: res.OwnPlacementOfBound,
			HeldOfBest: res.HeldOfBest,
			Requests:   s.Requests, OK: s.OK, Errors: s.Errors, Summary: s,
			PredictedCached: res.PredictedCached, EngineCached: res.EngineCached, Precision: res.Precision, Precise: res.Precise,
		})
	}
	return fs
}

// build returns shape's workload at f's scale, with arrivals and think
// times in real time for o's TimeScale and RateScale (as BuildWorkload).
func (f *FamilyOptions) build(shape string, o *Options) (*load.Workload, error) {
	arrivals := o.TimeScale / o.RateScale // real seconds per unscaled second of arrivals
	at := func(d time.Duration) time.Duration { return time.Duration(float64(d) * arrivals) }
	think := func(d time.Duration) time.Duration { return time.Duration(float64(d) * o.TimeScale) }
	rate := 10 / arrivals // req/s of the one-shot shapes, real time
	n := func(x int) int { return max(1, int(math.Round(float64(x)*f.Scale))) }
	turns := func(x int) int { return max(3, int(math.Round(float64(x)*min(f.Scale, 1)))) }
	seed := f.Seed
	switch shape {
	case ShapeTenants:
		return load.Tenants(load.TenantsOptions{Tenants: 4, Sessions: n(12), SystemTokens: 6000, Turns: turns(5),
			UserTokens: 200, AnswerTokens: 150, Think: think(5 * time.Second), Duration: at(60 * time.Second), Seed: seed}), nil
	case ShapeAgentic:
		return load.Agentic(load.AgenticOptions{Sessions: n(8), Turns: turns(30), SystemTokens: 8000, TaskTokens: 4000,
			ToolTokens: 2100, AnswerTokens: 150, Think: think(5 * time.Second), Duration: at(30 * time.Second), Seed: seed}), nil
	case ShapeFewShot:
		return load.FewShot(load.FewShotOptions{N: n(300), Rate: rate, Templates: 6, TemplateTokens: 3000,
			QueryTokens: 150, MaxTokens: 100, Seed: seed}), nil
	case ShapeRAG:
		return load.RAG(load.RAGOptions{N: n(300), Rate: rate, SystemTokens: 800, Documents: 16, DocumentTokens: 2500,
			QuestionTokens: 100, MaxTokens: 100, Seed: seed}), nil
	case ShapeHotPrefix:
		return load.HotPrefix(load.HotPrefixOptions{N: n(300), Rate: rate, Share: 0.5, PrefixTokens: 4000,
			SuffixTokens: 200, MaxTokens: 100, Seed: seed}), nil
	case ShapeNoReuse:
		return load.NoReuse(load.NoReuseOptions{N: n(300), Rate: rate, PromptTokens: 1024, MaxTokens: 100, Seed: seed})
	case ShapeSequential:
		return load.Sequential(load.SequentialOptions{Conversations: 12, Turns: turns(6), SystemTokens: 4000,
			UserTokens: 300, AnswerTokens: 100, Think: think(500 * time.Millisecond), Seed: seed}), nil
	case ShapeBursts:
		return load.Bursts(load.BurstsOptions{Bursts: n(10), PerBurst: 32, Gap: at(6 * time.Second), Prefixes: 4,
			PrefixTokens: 3000, SuffixTokens: 200, MaxTokens: 100, Seed: seed}), nil
	case ShapeMooncake:
		if f.MooncakeTrace == "" {
			return nil, errors.New("no Mooncake trace given")
		}
		w, err := load.Mooncake(f.MooncakeTrace, load.MooncakeOptions{TimeScale: o.TimeScale, RateScale: o.RateScale, Limit: n(300)})
		if err != nil {
			return nil, err
		}
		w.Name = fmt.Sprintf("mooncake(first %d)", len(w.Requests))
		return w, nil
	case ShapeAzure:
		if f.AzureTrace == "" {
			return nil, errors.New("no Azure trace given")
		}
		w, err := load.NoReuse(load.NoReuseOptions{N: n(300), Rate: rate, AzurePath: f.AzureTrace, MaxTokensCap: 256, Seed: seed})
		if err != nil {
			return nil, err
		}
		w.Name = fmt.Sprintf("azure(n=%d,%s)", len(w.Requests), filepath.Base(f.AzureTrace))
		return w, nil
	}
	return nil, fmt.Errorf("unknown shape %q", shape)
}

// WriteFiles writes family.md and family.json into dir.
func (r *FamilyReport) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, FileFamilyJSON), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, FileFamilyMarkdown), []byte(r.Markdown()), 0o644)
}

// Markdown renders the family table: rows shape × router, then each
// shape's workload and oracle.
func (r *FamilyReport) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## kvroute bench family\n\n")
	if r.Heavy {
		w("%d × %s replicas per router (block %d tokens), each shape at its heavy point (column *load*: size scale, rate scale, time scale), seed %d; %s.\n\n",
			r.Replicas, r.Preset, r.BlockSize, r.Seed, r.Host)
	} else {
		w("%d × %s replicas per router (block %d tokens), time scale %g, rate scale %g, size scale %g, seed %d; %s.\n\n",
			r.Replicas, r.Preset, r.BlockSize, r.TimeScale, r.RateScale, r.Scale, r.Seed, r.Host)
	}
	if len(r.Instances) > 0 {
		w("Each shape ran through %s kvroute instances sharing their cluster, on a fresh fleet each time (rows *×N*; with 1, one kvroute and no cluster); each shape's own report compares them.\n\n", joinInts(r.Instances, ", "))
	}
	w("*of (b)* is a router's hit tokens as a fraction of the finite-cache bound's (each request on the replica holding its longest cached prefix within 1.25× the mean prefill work, LRU caches of the replicas' capacity), *of (a)* of the ideal's (one server, unbounded cache). *placement* is the router's own placement (the replica that answered each request) replayed over the bound's caches, as a fraction of (b): 1 − *placement* is what its choices lost against the bound, *placement* − *of (b)* what the replicas' caches lost that the bound's do not (blocks pinned by running requests, prefixes evicted while a request waited). *held* is, over the requests, the prompt tokens each one's replica held when it arrived as a fraction of the most any replica held then: 1 − *held* is what the choices gave up of the replicas' own caches, on purpose (a prefix replicated, a turn moved off a loaded replica) or for want of knowing it. Times are simulated seconds; *prefill max/mean* compares the busiest replica's prefill tokens with the average.\n\n")
	tpot := len(r.Disaggregated) > 0 // the table gives TPOT p90 too
	if tpot {
		w("Rows *pd=P:D* are the router in front of P prefill and D decode replicas (%s protocol); their *of (b)* is against the bound over the P prefill replicas' caches (each shape's report gives it), and *TPOT p90* is the time per output token after the first.\n\n", r.Protocol)
		w("| shape | router | of (b) | of (a) | placement | held | TTFT p50 | TTFT p90 | TPOT p90 | prefill max/mean | errors |\n")
		w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	} else {
		w("| shape | router | of (b) | of (a) | placement | held | TTFT p50 | TTFT p90 | prefill max/mean | errors |\n")
		w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	}
	for i := range r.Shapes {
		s := &r.Shapes[i]
		for j := range s.Rows {
			row := &s.Rows[j]
			extra := ""
			if tpot {
				extra = " – |"
			}
			if row.Error != "" && row.Requests == 0 {
				w("| %s | %s | – | – | – | – | – | – |%s – | %s |\n", s.Shape, row.Router, extra, row.Error)
				continue
			}
			if tpot {
				extra = " " + secs(row.TPOTP90) + " |"
			}
			w("| %s | %s | %.3f | %.3f | %s | %s | %s | %s |%s %.2f | %s |\n", s.Shape, row.Router, row.OfBound, row.OfIdeal,
				fractionCell(row.OwnPlacementOfBound, row.OwnPlacementOfBound > 0), fractionCell(row.HeldOfBest, row.HeldOfBest > 0),
				secs(row.TTFTP50), secs(row.TTFTP90), extra, row.PrefillImbalance, errorCell(&row.Summary))
		}
	}
	r.preciseMarkdown(w)
	w("\n| shape | requests | prompt tokens | ideal (a) | bound (b) | bound prefill max/mean | load | workload |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for i := range r.Shapes {
		s := &r.Shapes[i]
		if s.Oracle == nil {
			continue
		}
		l := FamilyLoad{Scale: r.Scale, RateScale: r.RateScale, TimeScale: r.TimeScale}
		if s.Load != nil {
			l = *s.Load
		}
		w("| %s | %d | %s | %s | %s | %.2f | %s | %s |\n", s.Shape, s.Requests, count(s.PromptTokens),
			pct(s.Oracle.Ideal.HitRate), pct(s.Oracle.Bound.HitRate), s.Oracle.Bound.PrefillImbalance, l, s.Workload)
	}
	writeNotes(&b, r.Notes)
	return b.String()
}
