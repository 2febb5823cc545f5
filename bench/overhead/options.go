package overhead

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Scenario names.
const (
	ScenarioSmall     = "small"
	ScenarioMultiTurn = "multiturn"
	ScenarioStream    = "stream"
	// ScenarioManyStreams holds Options.ManyStreams streams open at once,
	// events Options.ManyStreamsGap apart: the relay's cost per event when
	// thousands of slow streams share the router.
	ScenarioManyStreams = "manystreams"
)

// Scenarios lists the scenarios in the order they run.
var Scenarios = []string{ScenarioSmall, ScenarioMultiTurn, ScenarioStream, ScenarioManyStreams}

// isStream reports whether scenario streams its answers.
func isStream(scenario string) bool {
	return scenario == ScenarioStream || scenario == ScenarioManyStreams
}

// Target names, as Options.Targets accepts them and as reports show them.
const (
	TargetDirect     = "direct"
	TargetFloor      = "floor"
	TargetNginx      = "nginx/round_robin"
	TargetRoundRobin = "kvroute/round_robin"
	TargetCacheAware = "kvroute/cache_aware"
)

// kvroutePrefix begins the kvroute targets' names; BaselinePrefix begins
// their twins served by Options.BaselineCommand.
const (
	kvroutePrefix  = "kvroute/"
	BaselinePrefix = "baseline/"
)

// Targets lists every target in report order. All but TargetFloor run by
// default; it runs when named.
var Targets = []string{TargetDirect, TargetFloor, TargetNginx, TargetRoundRobin, TargetCacheAware}

// targetAliases maps the short names Options.Targets also accepts.
var targetAliases = map[string]string{
	"direct": TargetDirect, "floor": TargetFloor, "nginx": TargetNginx, "round_robin": TargetRoundRobin, "cache_aware": TargetCacheAware,
}

// Options configures an overhead benchmark. DefaultOptions gives the
// command's defaults. A zero field means its default, but for Warmup,
// LowConcurrency and StreamGap, where it means none, and Out and Notes,
// where it means nothing is written.
type Options struct {
	// Duration is the measured time of each (scenario, concurrency, target)
	// run. Default 10s.
	Duration time.Duration
	// Warmup precedes each measured run with the same load, not counted.
	// Default 1s.
	Warmup time.Duration
	// Rounds repeats every (scenario, concurrency) comparison, the targets
	// taking turns in alternating order, and reports each target's median
	// round: on a machine whose speed drifts, every target then sees the
	// same drift. Default 1.
	Rounds int
	// Concurrency is the number of connections of the closed loop, each
	// sending its next request as soon as the last one completed. Default 64.
	Concurrency int
	// LowConcurrency is a second, low concurrency every scenario also runs
	// at, for added latency without queueing; 0 skips it. Default 1.
	LowConcurrency int
	// Upstreams is the number of fast upstreams. Default 4.
	Upstreams int
	// Scenarios to run, in this order (see Scenarios). Default all.
	Scenarios []string
	// Targets to run (Targets or their short names direct, nginx,
	// round_robin, cache_aware). Default all; direct is always included, as
	// the baseline. nginx is skipped with a note when it is not installed
	// unless named explicitly.
	Targets []string
	// StreamEvents is the number of events of each streamed response. Default 50.
	StreamEvents int
	// StreamGap is the upstream's pause between two events. Default 2ms.
	StreamGap time.Duration
	// ManyStreams is the number of concurrent streams of the manystreams
	// scenario, its only concurrency. Default 1000.
	ManyStreams int
	// ManyStreamsGap is the upstream's pause between two events of a
	// manystreams stream, an engine's time per output token. Default 40ms
	// (25 events/s per stream, 25,000 events/s at 1000 streams).
	ManyStreamsGap time.Duration
	// ManyStreamsSpread is how long the first requests of the manystreams
	// scenario are spread over, the warm-up starting once the last has
	// started. Default one stream's length (StreamEvents times
	// ManyStreamsGap): as many streams then end and start in every gap,
	// as when independent users stream. Shorter spreads synchronize the
	// streams, which then all end and start again within it, once per
	// stream's length.
	ManyStreamsSpread time.Duration
	// MultiTurnBytes is the body size at which a conversation restarts.
	// Default 32768.
	MultiTurnBytes int
	// CPUs places the processes: "auto" (the default: driver on the first
	// half of the allowed CPUs, routers on the second, when there are at
	// least two and taskset is installed), "none", or "DRIVER/ROUTER" as two
	// CPU lists, e.g. "0/1" or "0-3/4-7".
	CPUs string
	// DriverProcsPerCPU is the driver's GOMAXPROCS per CPU it is pinned
	// to. Default 4. With one P per CPU, a busy Go scheduler looks at the
	// network only when its run queue is empty (or when its monitor thread
	// gets to it, up to 10 ms later), so the events the load generator
	// receives wait behind the timers of those its upstreams send: at 1000
	// streams direct's own p99 was 14–80 ms, hiding any router's. With
	// idle Ps parked in the netpoller the kernel wakes the receiving thread
	// instead (direct's p99 2.5–6.5 ms in the same runs).
	DriverProcsPerCPU int
	// NginxPath is the nginx binary; empty looks in PATH and /usr/sbin.
	NginxPath string
	// KvrouteCommand is the command line that serves kvroute, to which
	// "--config <path>" is appended. Default: this executable followed by
	// "serve", which is right when this program is kvroute.
	KvrouteCommand []string
	// BaselineCommand, when set, serves a second kvroute (another build,
	// to compare before and after in one run): each kvroute target gets a
	// twin named with BaselinePrefix instead of "kvroute/", which takes
	// its turn right before it in every round.
	BaselineCommand []string
	// LogLevel is kvroute's log.level: info (the default) writes an access
	// line per request, and nginx then writes its access log too (combined
	// format, unbuffered, to a file); warn or error write none, and nginx
	// runs with access_log off.
	LogLevel string
	// CPUProfile saves each kvroute target's CPU profile of every measured
	// run (from its admin listener's /debug/pprof/profile, whole seconds
	// covering the window) under Out's routers/ directory.
	CPUProfile bool
	// Out is the directory for overhead.md, overhead.json and the routers'
	// configurations and logs (under routers/); empty writes nothing.
	Out string
	// Notes receives one line per step (router started, run finished);
	// nil discards them.
	Notes io.Writer
}

// logAccess is the log level at which kvroute writes an access line per
// request (and nginx is given its access log).
const logAccess = "info"

// DefaultOptions returns the defaults of kvroute bench overhead.
func DefaultOptions() Options {
	return Options{
		Duration:       10 * time.Second,
		Warmup:         time.Second,
		Rounds:         1,
		Concurrency:    64,
		LowConcurrency: 1,
		Upstreams:      4,
		Scenarios:      slices.Clone(Scenarios),
		StreamEvents:   50,
		StreamGap:      2 * time.Millisecond,
		ManyStreams:    1000,
		ManyStreamsGap: 40 * time.Millisecond,
		MultiTurnBytes: 32 << 10,
		CPUs:           cpusAuto,
		LogLevel:       logAccess,

		DriverProcsPerCPU: 4,
	}
}

// withDefaults fills zero fields and checks the rest. It returns the
// targets resolved to full names (direct first) and which were explicit.
func (o Options) withDefaults() (Options, map[string]bool, error) {
	d := DefaultOptions()
	o.Duration = cmp.Or(o.Duration, d.Duration)
	o.Concurrency = cmp.Or(o.Concurrency, d.Concurrency)
	o.Rounds = cmp.Or(o.Rounds, d.Rounds)
	o.Upstreams = cmp.Or(o.Upstreams, d.Upstreams)
	if len(o.Scenarios) == 0 {
		o.Scenarios = d.Scenarios
	}
	o.StreamEvents = cmp.Or(o.StreamEvents, d.StreamEvents)
	o.ManyStreams = cmp.Or(o.ManyStreams, d.ManyStreams)
	o.ManyStreamsGap = cmp.Or(o.ManyStreamsGap, d.ManyStreamsGap)
	o.ManyStreamsSpread = cmp.Or(o.ManyStreamsSpread, time.Duration(o.StreamEvents)*o.ManyStreamsGap)
	o.MultiTurnBytes = cmp.Or(o.MultiTurnBytes, d.MultiTurnBytes)
	o.CPUs = cmp.Or(o.CPUs, d.CPUs)
	o.DriverProcsPerCPU = cmp.Or(o.DriverProcsPerCPU, d.DriverProcsPerCPU)
	o.LogLevel = cmp.Or(o.LogLevel, d.LogLevel)
	var errs []error
	if o.Duration < 0 || o.Warmup < 0 || o.StreamGap < 0 || o.ManyStreamsGap < 0 || o.ManyStreamsSpread < 0 {
		errs = append(errs, errors.New("duration, warmup, stream gaps and the many-streams spread must not be negative"))
	}
	if o.Concurrency < 1 || o.LowConcurrency < 0 || o.Upstreams < 1 || o.StreamEvents < 1 || o.Rounds < 1 || o.ManyStreams < 1 || o.DriverProcsPerCPU < 1 {
		errs = append(errs, errors.New("concurrency, rounds, upstreams, stream events, many streams and driver procs per CPU must be at least 1, low concurrency at least 0"))
	}
	if o.MultiTurnBytes < 4096 {
		errs = append(errs, fmt.Errorf("multiturn bytes must be at least 4096, got %d", o.MultiTurnBytes))
	}
	if !slices.Contains([]string{logAccess, "warn", "error"}, o.LogLevel) {
		errs = append(errs, fmt.Errorf("log level %q: want info (access lines on, nginx's too), warn or error", o.LogLevel))
	}
	var scen []string
	for _, s := range o.Scenarios {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case !slices.Contains(Scenarios, s):
			errs = append(errs, fmt.Errorf("unknown scenario %q (want %s)", s, strings.Join(Scenarios, ", ")))
		case !slices.Contains(scen, s):
			scen = append(scen, s)
		}
	}
	o.Scenarios = scen
	explicit := map[string]bool{}
	want := map[string]bool{TargetDirect: true}
	if len(o.Targets) == 0 {
		for _, t := range Targets {
			want[t] = t != TargetFloor
		}
	}
	for _, t := range o.Targets {
		t = strings.TrimSpace(t)
		if t == "" || t == "all" {
			for _, full := range Targets {
				want[full] = want[full] || full != TargetFloor
			}
			continue
		}
		if full, ok := targetAliases[t]; ok {
			t = full
		}
		if !slices.Contains(Targets, t) {
			errs = append(errs, fmt.Errorf("unknown target %q (want all, %s, or direct, floor, nginx, round_robin, cache_aware)", t, strings.Join(Targets, ", ")))
			continue
		}
		want[t], explicit[t] = true, true
	}
	o.Targets = o.Targets[:0:0]
	for _, t := range Targets {
		if !want[t] {
			continue
		}
		if policy, ok := strings.CutPrefix(t, kvroutePrefix); ok && len(o.BaselineCommand) > 0 {
			o.Targets = append(o.Targets, BaselinePrefix+policy)
		}
		o.Targets = append(o.Targets, t)
	}
	if o.LowConcurrency == o.Concurrency {
		o.LowConcurrency = 0
	}
	return o, explicit, errors.Join(errs...)
}

// concurrencies returns the concurrencies scenario runs at.
func (o *Options) concurrencies(scenario string) []int {
	if scenario == ScenarioManyStreams {
		return []int{o.ManyStreams}
	}
	if o.LowConcurrency > 0 {
		return []int{o.Concurrency, o.LowConcurrency}
	}
	return []int{o.Concurrency}
}
