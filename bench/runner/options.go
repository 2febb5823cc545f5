package runner

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
)

// The workload names.
const (
	workloadMooncake  = "mooncake"
	workloadMultiTurn = "multiturn"
	workloadHotPrefix = "hotprefix"
	workloadNoReuse   = "noreuse"
	workloadNoisy     = "noisy"
)

// FamilyWorkloadPrefix before a shape of the family (Shapes) names that
// shape as a workload, "family:tenants", as RunFamily builds it at scale
// 1 with the seed of the synthetic workloads (MultiTurn.Seed) and their
// traces (Mooncake.TracePath, NoReuse.AzurePath).
const FamilyWorkloadPrefix = "family:"

// Workloads lists the workload names Options.Workload accepts, besides the
// family's shapes (FamilyWorkloadPrefix).
var Workloads = []string{workloadMooncake, workloadMultiTurn, workloadHotPrefix, workloadNoReuse, workloadNoisy}

// DefaultTTFTTarget is the goodput TTFT bound, in unscaled time.
const DefaultTTFTTarget = 2 * time.Second

// Options configures a benchmark. DefaultOptions gives a complete set;
// the zero value of a field means the default noted beside it.
type Options struct {
	// Workload is one of Workloads. Default "multiturn".
	Workload string
	// Mooncake configures the mooncake workload.
	Mooncake MooncakeOptions
	// MultiTurn configures the multiturn workload. Think and Duration are
	// unscaled (simulated) durations; the runner multiplies them by
	// TimeScale and divides Duration by RateScale.
	MultiTurn load.MultiTurnOptions
	// HotPrefix configures the hotprefix workload. Rate is unscaled req/s.
	HotPrefix load.HotPrefixOptions
	// NoReuse configures the noreuse workload. Rate is unscaled req/s; with
	// TraceArrivals the trace's own times are scaled.
	NoReuse load.NoReuseOptions
	// Noisy configures the noisy workload: a victim tenant and an
	// aggressor flooding the fleet (see NoisyOptions).
	Noisy NoisyOptions
	// Flow is the flow control of the kvroute routers that run with it
	// (NameFlow, kvroute/cache_aware+flow).
	Flow FlowOptions
	// Bound describes the fleet behind RunURL's endpoint, for its bounds;
	// the zero value computes none. Run ignores it (its fleets are its own).
	Bound URLBound
	// RateScale multiplies the arrival rate of every workload (2 sends the
	// same requests twice as fast). Default 1.
	RateScale float64
	// Limit keeps only the first Limit requests of the workload (in arrival
	// order); 0 keeps all.
	Limit int

	// Replicas is the number of simulated replicas per router. Default 8.
	Replicas int
	// Preset names the sim cost preset (sim.Presets). Default sim.DefaultPreset.
	Preset string
	// Model is the served model name; empty uses the preset's.
	Model string
	// TimeScale multiplies all simulated time (and the workload's arrivals);
	// reported durations are divided by it. Default 0.1.
	TimeScale float64
	// StreamFlushInterval is the sim's minimum real time between two writes
	// of one stream (sim.Config.StreamFlushInterval): fewer, larger writes
	// at fast time scales. It never delays the first token. 0 writes after
	// every engine step.
	StreamFlushInterval time.Duration

	// Routers names the routers to compare (see RouterNames); empty means
	// every kvroute policy plus nginx and HAProxy when installed.
	Routers []string
	// Precise adds NamePrecise, kvroute/cache_aware in precise mode, to
	// Routers (to every router when Routers is empty), right after
	// kvroute/cache_aware (added too when Routers lacks it): on its own
	// fresh fleet, which publishes KV events for it. Not with Instances.
	Precise bool
	// PreciseRenderTimeout is the precise kvroute's precise.render_timeout,
	// in real time: a render is real work, not simulated, so it is not
	// scaled. Default 20ms (kvroute's default).
	PreciseRenderTimeout time.Duration
	// KvrouteCommand, when set, runs every kvroute router (not the
	// instances of Instances) in a process of its own (Kvroute.Command):
	// the command, then --config and a file.
	KvrouteCommand []string
	// PreciseCutEvents, when set, is two fractions 0 < cut < restore < 1
	// of the workload's requests: once that many have completed, the
	// precise kvroute's fleet cuts every replica's KV event stream
	// (sim.Replica.CutKVEvents), and restores it at the second, so that
	// kvroute sees the gap and replays it mid-run. Empty cuts nothing.
	PreciseCutEvents []float64
	// TTFTTarget is the goodput TTFT bound, unscaled. Default DefaultTTFTTarget.
	TTFTTarget time.Duration
	// RequestTimeout bounds each request, unscaled. Default 10m.
	RequestTimeout time.Duration
	// NginxPath and HAProxyPath are the binaries; empty looks them up in
	// PATH and then in /usr/sbin and /usr/local/sbin.
	NginxPath, HAProxyPath string
	// Instances, when not empty, compares numbers of kvroute instances
	// instead of routers: the workload runs once per number N, through N
	// kvroute instances sharing their decisions through their cluster
	// behind a front that spreads connections over them (1: one kvroute,
	// no cluster, the baseline); see [Instances]. Routers then names one
	// kvroute policy at most (default cache_aware).
	Instances []int
	// Disaggregated lists fleet splits "P:D" (P prefill and D decode
	// replicas, P+D = Replicas): for each, every kvroute router also runs
	// in front of such a fleet, pairing in DisaggregationProtocol (see
	// disagg.go). Empty: none.
	Disaggregated []string
	// DisaggregationProtocol is the disaggregated fleets' protocol: vllm
	// (the default) or sglang.
	DisaggregationProtocol string
	// LocalPrefillTokens is the vLLM split fleets' kvroute
	// disaggregation.local_prefill_tokens (a decode replica holding all of
	// a prompt but that many tokens computes it itself); 0: never.
	LocalPrefillTokens int
	// LocalPrefillBacklog is the vLLM split fleets' kvroute
	// disaggregation.local_prefill_backlog (a decode replica computes a
	// prompt itself while every prefill replica has that many tokens
	// waiting, if it would be done sooner); 0: never.
	LocalPrefillBacklog int
	// LocalPrefillMaxRunning is their local_prefill_max_running (a decode
	// replica takes such a prompt only while its engine runs fewer
	// requests); 0: any number.
	LocalPrefillMaxRunning int
	// KillInstanceAt, in (0, 1), stops one instance (the last) of every
	// run with more than one once that fraction of the workload's requests
	// has been dispatched; 0 stops none. Only with Instances.
	KillInstanceAt float64
	// LeadTimeout is the instances' cluster.lead_timeout, in real time
	// (an ask is real work, not scaled); 0: kvroute's default (10ms).
	LeadTimeout time.Duration

	// Out is the directory for results.md, results.json, results.svg and
	// the routers' configurations and logs; empty writes nothing.
	Out string
	// Progress receives a progress bar while the benchmark runs (typically
	// os.Stderr); nil shows none.
	Progress io.Writer
	// Notes receives one line per notable event (a router skipped, a router
	// started); nil discards them. They are also kept in Report.Notes.
	Notes io.Writer
}

// MooncakeOptions configures the mooncake workload.
type MooncakeOptions struct {
	// TracePath is the conversation trace (load.MooncakeTraceURL); the
	// mooncake workload needs it, and there is no default: the repository
	// ships no trace.
	TracePath string
	// StartAt skips the trace before this (unscaled) time.
	StartAt time.Duration
	// MaxTokensCap caps each request's output length; 0 keeps the trace's.
	MaxTokensCap int
}

// DefaultOptions returns the benchmark defaults: the multiturn workload on
// 8 llama-8b-h100 replicas at time scale 0.1, every router.
func DefaultOptions() Options {
	return Options{
		Workload:  workloadMultiTurn,
		MultiTurn: load.MultiTurnOptions{Users: 64, SystemPrompts: 4, SystemTokens: 2000, Turns: 6, Think: 5 * time.Second, UserTokens: 200, AnswerTokens: 200, Duration: 60 * time.Second, Seed: 1},
		HotPrefix: load.HotPrefixOptions{N: 1000, Rate: 20, Share: 0.25, PrefixTokens: 4000, SuffixTokens: 200, MaxTokens: 128, Seed: 1},
		NoReuse:   load.NoReuseOptions{N: 1000, Rate: 20, PromptTokens: 1024, MaxTokens: 128, Seed: 1},
		Noisy:     DefaultNoisyOptions(),
		Flow:      DefaultFlowOptions(),
		RateScale: 1,
		Replicas:  8,
		Preset:    sim.DefaultPreset,
		TimeScale: 0.1,
		// 5 ms real is 50 ms of simulated time at the default scale, a few
		// decode steps: the stream still looks like a stream, with a tenth
		// of the writes.
		StreamFlushInterval: 5 * time.Millisecond,
		TTFTTarget:          DefaultTTFTTarget,
		RequestTimeout:      10 * time.Minute,
	}
}

// withDefaults fills zero fields from DefaultOptions and checks the rest.
func (o Options) withDefaults() (Options, error) {
	d := DefaultOptions()
	o.Workload = cmp.Or(o.Workload, d.Workload)
	if o.RateScale == 0 {
		o.RateScale = 1
	}
	o.Replicas = cmp.Or(o.Replicas, d.Replicas)
	o.Preset = cmp.Or(o.Preset, d.Preset)
	o.TimeScale = cmp.Or(o.TimeScale, d.TimeScale)
	o.TTFTTarget = cmp.Or(o.TTFTTarget, d.TTFTTarget)
	o.RequestTimeout = cmp.Or(o.RequestTimeout, d.RequestTimeout)
	o.Noisy = o.Noisy.withDefaults()
	o.Flow = o.Flow.withDefaults()
	var errs []error
	if shape, ok := strings.CutPrefix(o.Workload, FamilyWorkloadPrefix); ok {
		if !slices.Contains(Shapes, shape) {
			errs = append(errs, fmt.Errorf("workload %q: want %s and one of %s", o.Workload, FamilyWorkloadPrefix, strings.Join(Shapes, ", ")))
		}
	} else if !slices.Contains(Workloads, o.Workload) {
		errs = append(errs, fmt.Errorf("workload %q: want one of %s", o.Workload, strings.Join(Workloads, ", ")))
	}
	if o.Replicas < 1 {
		errs = append(errs, fmt.Errorf("replicas must be at least 1, got %d", o.Replicas))
	}
	if _, err := sim.PresetConfig(o.Preset); err != nil {
		errs = append(errs, err)
	}
	if o.TimeScale <= 0 {
		errs = append(errs, fmt.Errorf("time scale must be positive, got %v", o.TimeScale))
	}
	if o.RateScale <= 0 {
		errs = append(errs, fmt.Errorf("rate scale must be positive, got %v", o.RateScale))
	}
	if o.Limit < 0 {
		errs = append(errs, fmt.Errorf("limit must not be negative, got %d", o.Limit))
	}
	if n := len(o.PreciseCutEvents); n > 0 && (n != 2 || !(o.PreciseCutEvents[0] > 0 && o.PreciseCutEvents[0] < o.PreciseCutEvents[1] && o.PreciseCutEvents[1] < 1)) {
		errs = append(errs, fmt.Errorf("precise cut events: want two fractions 0 < cut < restore < 1, got %v", o.PreciseCutEvents))
	}
	if o.PreciseRenderTimeout < 0 {
		errs = append(errs, fmt.Errorf("precise render timeout must not be negative, got %v", o.PreciseRenderTimeout))
	}
	if o.TTFTTarget < 0 || o.RequestTimeout < 0 {
		errs = append(errs, errors.New("ttft target and request timeout must not be negative"))
	}
	errs = append(errs, o.checkInstances(), o.Noisy.check(), o.Flow.check())
	if o.Workload == workloadNoisy && len(o.Instances) > 0 {
		errs = append(errs, errors.New("the noisy workload compares routers and their flow control, not numbers of instances"))
	}
	if _, err := o.splits(); err != nil {
		errs = append(errs, err)
	}
	switch {
	case o.Workload == workloadMooncake:
		errs = append(errs, load.CheckTrace(load.TraceMooncake, o.Mooncake.TracePath, "the mooncake workload"))
	case o.Workload == workloadNoReuse && (o.NoReuse.AzurePath != "" || o.NoReuse.TraceArrivals):
		errs = append(errs, load.CheckTrace(load.TraceAzure, o.NoReuse.AzurePath, "--trace-arrivals"))
	}
	return o, errors.Join(errs...)
}

// simConfig returns the replicas' configuration.
func (o *Options) simConfig() (sim.Config, error) {
	c, err := sim.PresetConfig(o.Preset)
	if err != nil {
		return sim.Config{}, err
	}
	c.TimeScale = o.TimeScale
	if o.Model != "" {
		c.Model = o.Model
	}
	c.StreamFlushInterval = o.StreamFlushInterval
	return c, nil
}

// routerNames is Routers with NamePrecise added when Precise is set.
func (o *Options) routerNames() []string {
	if !o.Precise {
		return o.Routers
	}
	names := slices.Clone(o.Routers)
	if len(names) == 0 {
		names = []string{routersAll}
	}
	return append(names, NamePrecise)
}

// requestTimeout is the real per-request timeout: RequestTimeout scaled,
// but never under 10 s so that a fast time scale cannot turn the router's
// real overhead into timeouts.
func (o *Options) requestTimeout() time.Duration {
	return max(time.Duration(float64(o.RequestTimeout)*o.TimeScale), 10*time.Second)
}
