package overhead

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Report file names inside the output directory.
const (
	FileMarkdown = "overhead.md"
	FileJSON     = "overhead.json"
)

// Report is the outcome of an overhead benchmark.
type Report struct {
	Started time.Time `json:"started"`
	Wall    float64   `json:"wall_seconds"`
	Setup   Setup     `json:"setup"`
	// Results has one entry per (scenario, concurrency, target), in run order.
	Results []Result `json:"results"`
	// Checks evaluates kvroute's fast-path targets (see evaluate).
	Checks []Check  `json:"checks"`
	Notes  []string `json:"notes,omitempty"`
}

// Setup describes how the benchmark ran.
type Setup struct {
	Duration       float64 `json:"duration_seconds"`
	Warmup         float64 `json:"warmup_seconds"`
	Rounds         int     `json:"rounds"`
	Concurrency    int     `json:"concurrency"`
	LowConcurrency int     `json:"low_concurrency,omitempty"`
	Upstreams      int     `json:"upstreams"`
	StreamEvents   int     `json:"stream_events"`
	StreamGapMs    float64 `json:"stream_gap_ms"`
	MultiTurnBytes int     `json:"multiturn_bytes"`
	// The manystreams scenario's concurrent streams and pause between events.
	ManyStreams      int     `json:"many_streams,omitempty"`
	ManyStreamsGapMs float64 `json:"many_streams_gap_ms,omitempty"`
	// The manystreams scenario's first requests were spread over this time.
	ManyStreamsSpreadMs float64 `json:"many_streams_spread_ms,omitempty"`

	GoVersion     string     `json:"go_version"`
	CPUModel      string     `json:"cpu_model,omitempty"`
	NumCPU        int        `json:"num_cpu"`
	DriverCPUs    []int      `json:"driver_cpus,omitempty"`
	RouterCPUs    []int      `json:"router_cpus,omitempty"`
	DriverProcs   int        `json:"driver_gomaxprocs"`
	NginxVersion  string     `json:"nginx_version,omitempty"`
	NginxWorkers  int        `json:"nginx_workers,omitempty"`
	KvrouteLog    string     `json:"kvroute_log_level"`
	LoadAvgBefore [3]float64 `json:"loadavg_before"`
	LoadAvgAfter  [3]float64 `json:"loadavg_after"`
}

// Percentiles of a distribution, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// Result is one (scenario, concurrency, target) run.
type Result struct {
	Scenario    string `json:"scenario"`
	Concurrency int    `json:"concurrency"`
	Target      string `json:"target"`
	// Error is set when the target could not run; nothing else is then.
	Error string `json:"error,omitempty"`

	// Requests completed inside the measured window (streams, for stream).
	Requests int64 `json:"requests"`
	// Errors are failed requests, warm-up included.
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	Seconds    float64 `json:"seconds"`
	RPS        float64 `json:"requests_per_second"`
	// MeanBodyBytes is the mean request body size.
	MeanBodyBytes float64 `json:"mean_body_bytes"`
	// LatencyMs is the request latency (to the last byte).
	LatencyMs Percentiles `json:"latency_ms"`
	// AddedMs is LatencyMs minus direct's; nil for direct.
	AddedMs *Percentiles `json:"added_ms,omitempty"`

	// Stream only: events received, each event's arrival − emission, and
	// that minus direct's.
	Events       int64        `json:"events,omitempty"`
	EventMs      *Percentiles `json:"event_latency_ms,omitempty"`
	EventAddedMs *Percentiles `json:"event_added_ms,omitempty"`
	// EventAddedP99Paired is, over rounds, the event p99 minus direct's in
	// the same round (run next to each other, so the machine's phase
	// cancels): its median and range. Nil with fewer than two rounds.
	EventAddedP99Paired *Spread `json:"event_added_p99_paired_ms,omitempty"`
	EventsPerSec        float64 `json:"events_per_second,omitempty"`
	RouterCPU           float64 `json:"router_cpu_cores"`          // CPU seconds per second during the window
	RouterCPUPerOp      float64 `json:"router_cpu_us_per_request"` // per event in stream scenarios
	DriverCPU           float64 `json:"driver_cpu_cores"`
	// Rounds has every round's figures, in run order, when there was more
	// than one; the other fields are those of the median round (Errors
	// counts all rounds).
	Rounds []RoundFigures `json:"rounds,omitempty"`
}

// Spread is a figure's median over rounds and its range.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// pairedP99 is x's event p99 minus d's, round by round.
func pairedP99(x, d *Result) *Spread {
	if len(x.Rounds) < 2 || len(x.Rounds) != len(d.Rounds) {
		return nil
	}
	v := make([]float64, len(x.Rounds))
	for i := range x.Rounds {
		v[i] = x.Rounds[i].EventP99Ms - d.Rounds[i].EventP99Ms
	}
	m := median(v) // sorts v
	return &Spread{Median: m, Min: v[0], Max: v[len(v)-1]}
}

// RoundFigures are one round's headline figures.
type RoundFigures struct {
	RPS            float64 `json:"requests_per_second"`
	RouterCPU      float64 `json:"router_cpu_cores"`
	RouterCPUPerOp float64 `json:"router_cpu_us_per_request"`
	// Stream scenarios: the round's event latency p50 and p99.
	EventP50Ms float64 `json:"event_p50_ms,omitempty"`
	EventP99Ms float64 `json:"event_p99_ms,omitempty"`
}

// rounds returns x's figures by round: Rounds, or x's own as one round.
func (x *Result) rounds() []RoundFigures {
	if len(x.Rounds) > 0 {
		return x.Rounds
	}
	return []RoundFigures{{RPS: x.RPS, RouterCPU: x.RouterCPU, RouterCPUPerOp: x.RouterCPUPerOp}}
}

// saturatedCore is the router CPU (in cores) from which a router counts as
// the bottleneck of its round: its core is busy all but a tenth of the time.
const saturatedCore = 0.9

// saturatedCapacity compares the capacity of router a with router b's,
// as b's CPU time per request over a's, in the rounds where both routers
// saturated their core (the same round of each ran back to back). When the
// load generator is the bottleneck instead, requests/s flatter the costlier
// router and an idling router's CPU per request grows; only rounds where
// both were the bottleneck measure capacity. It returns the median ratio
// over those rounds and how many there were.
func saturatedCapacity(a, b *Result) (ratio float64, n int) {
	ra, rb := a.rounds(), b.rounds()
	var v []float64
	for i := range min(len(ra), len(rb)) {
		if ra[i].RouterCPU >= saturatedCore && rb[i].RouterCPU >= saturatedCore && ra[i].RouterCPUPerOp > 0 {
			v = append(v, rb[i].RouterCPUPerOp/ra[i].RouterCPUPerOp)
		}
	}
	return median(v), len(v)
}

// median of v (the mean of the middle two for an even count), 0 if empty.
// It sorts v.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// Check is one of kvroute's fast-path targets, evaluated.
type Check struct {
	Target string `json:"target"`
	Got    string `json:"got"`
	OK     bool   `json:"ok"`
}

// WriteFiles writes overhead.md and overhead.json into dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, FileJSON), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, FileMarkdown), []byte(r.Markdown()), 0o644)
}

// find returns the result of target at scenario and concurrency, or nil.
func (r *Report) find(scenario string, c int, target string) *Result {
	for i := range r.Results {
		x := &r.Results[i]
		if x.Scenario == scenario && x.Concurrency == c && x.Target == target && x.Error == "" {
			return x
		}
	}
	return nil
}

// addDeltas fills every router's added latencies from direct's.
func (r *Report) addDeltas() {
	sub := func(a, b Percentiles) *Percentiles {
		return &Percentiles{P50: a.P50 - b.P50, P90: a.P90 - b.P90, P99: a.P99 - b.P99}
	}
	for i := range r.Results {
		x := &r.Results[i]
		if x.Target == TargetDirect || x.Error != "" || x.Requests == 0 {
			continue
		}
		d := r.find(x.Scenario, x.Concurrency, TargetDirect)
		if d == nil || d.Requests == 0 {
			continue
		}
		x.AddedMs = sub(x.LatencyMs, d.LatencyMs)
		if x.EventMs != nil && d.EventMs != nil {
			x.EventAddedMs = sub(*x.EventMs, *d.EventMs)
			x.EventAddedP99Paired = pairedP99(x, d)
		}
	}
}

// evaluate fills r.Checks with kvroute's fast-path targets, where the
// results needed are present: round_robin at nginx's requests/s on small
// requests, cache_aware at 0.8× round_robin's on multi-turn, and under
// 1 ms added per streamed event at p99.
func (r *Report) evaluate() {
	c := r.Setup.Concurrency
	// Throughput targets: the requests/s ratio, and the capacity ratio in
	// the rounds where both routers were the bottleneck.
	ratioCheck := func(target string, a, b *Result, want float64) {
		got := fmt.Sprintf("%.0f vs %.0f req/s (%.2f×)", a.RPS, b.RPS, a.RPS/b.RPS) + cpuRatio(a, b)
		ok := a.RPS >= want*b.RPS && a.Errors == 0
		capRatio, n := saturatedCapacity(a, b)
		if n > 0 {
			got += fmt.Sprintf("; with both routers' cores saturated (%d of %d rounds) %.2f× the capacity", n, len(a.rounds()), capRatio)
			ok = ok && capRatio >= want
		}
		r.Checks = append(r.Checks, Check{Target: target, Got: got, OK: ok})
	}
	if rr, ng := r.find(ScenarioSmall, c, TargetRoundRobin), r.find(ScenarioSmall, c, TargetNginx); rr != nil && ng != nil && ng.RPS > 0 {
		ratioCheck(fmt.Sprintf("kvroute round_robin req/s ≥ nginx on small requests (C=%d)", c), rr, ng, 1)
	}
	if ca, rr := r.find(ScenarioMultiTurn, c, TargetCacheAware), r.find(ScenarioMultiTurn, c, TargetRoundRobin); ca != nil && rr != nil && rr.RPS > 0 {
		ratioCheck(fmt.Sprintf("kvroute cache_aware ≥ 0.8 × round_robin req/s on multi-turn (C=%d)", c), ca, rr, 0.8)
	}
	type streamRun struct {
		scenario string
		conc     int
	}
	runs := []streamRun{{ScenarioStream, c}}
	if r.Setup.LowConcurrency > 0 {
		runs = append(runs, streamRun{ScenarioStream, r.Setup.LowConcurrency})
	}
	if r.Setup.ManyStreams > 0 {
		runs = append(runs, streamRun{ScenarioManyStreams, r.Setup.ManyStreams})
	}
	for _, sr := range runs {
		sc, cc := sr.scenario, sr.conc
		var got []string
		ok, found := true, false
		for _, t := range []string{TargetRoundRobin, TargetCacheAware} {
			x := r.find(sc, cc, t)
			if x == nil || x.EventAddedMs == nil {
				continue
			}
			found = true
			added, how := addedP99(x)
			got = append(got, fmt.Sprintf("%s %+.3f ms%s", strings.TrimPrefix(t, "kvroute/"), added, how))
			ok = ok && added < 1 && x.Errors == 0
		}
		if !found {
			continue
		}
		if ng := r.find(sc, cc, TargetNginx); ng != nil && ng.EventAddedMs != nil {
			added, how := addedP99(ng)
			got = append(got, fmt.Sprintf("(nginx %+.3f ms%s)", added, how))
		}
		target := fmt.Sprintf("kvroute streaming adds < 1 ms per event at p99 (C=%d)", cc)
		if sc == ScenarioManyStreams {
			target = fmt.Sprintf("kvroute streaming adds < 1 ms per event at p99 with %d concurrent streams", cc)
		}
		r.Checks = append(r.Checks, Check{
			Target: target,
			Got:    strings.Join(got, ", "),
			OK:     ok,
		})
	}
}

// addedP99 is the event p99 x adds over direct, as its targets judge it:
// the median of the round-by-round differences when there were rounds,
// else the single run's; how says which, with the rounds' range.
func addedP99(x *Result) (added float64, how string) {
	if p := x.EventAddedP99Paired; p != nil {
		return p.Median, fmt.Sprintf(" [rounds %+.3f to %+.3f]", p.Min, p.Max)
	}
	return x.EventAddedMs.P99, ""
}

// cpuRatio compares the routers' CPU time per request, the throughput each
// would reach with its core to itself: when the load generator saturates
// its own core first, the requests/s of the faster router understate it.
func cpuRatio(a, b *Result) string {
	ca, cb := cpuPerOp(a), cpuPerOp(b)
	if ca <= 0 || cb <= 0 {
		return ""
	}
	return fmt.Sprintf("; router CPU %.1f vs %.1f µs per request (%.2f× the capacity)", ca, cb, cb/ca)
}

// cpuPerOp is the router's CPU time per request: the median over its
// rounds.
func cpuPerOp(x *Result) float64 {
	rs := x.rounds()
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.RouterCPUPerOp
	}
	return median(v)
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	s := r.Setup
	w("## kvroute bench overhead\n\n")
	concs := fmt.Sprintf("%d", s.Concurrency)
	if s.LowConcurrency > 0 {
		concs += fmt.Sprintf(" and %d", s.LowConcurrency)
	}
	w("The same %d fast upstreams (in-process fasthttp servers answering at once, looking like idle vLLM replicas) behind each router, "+
		"driven by the same closed-loop fasthttp load generator at %s connections: %s measured per run after %s of warm-up. "+
		"*Added* is the router's percentile minus direct's (the client talking to one upstream) at the same scenario and concurrency.\n\n",
		s.Upstreams, concs, dur(s.Duration), dur(s.Warmup))
	if s.Rounds > 1 {
		w("Each comparison ran **%d rounds**, the targets taking turns (in reverse order every other round) so that the machine's drift "+
			"reaches all alike; each row is the target's round with the median req/s, except *router µs/req*, the median over its rounds. "+
			"Every round is listed under the table.\n\n", s.Rounds)
	}
	place := "no CPU placement (the kernel schedules everything on any CPU)"
	if len(s.DriverCPUs) > 0 {
		place = fmt.Sprintf("the driver (load generator and upstreams, GOMAXPROCS %d) pinned to CPU %s, each router to CPU %s under taskset "+
			"(so every router hop crosses CPUs: at low concurrency the added latency includes waking the router's idle CPU, which every router pays alike)",
			s.DriverProcs, formatCPUList(s.DriverCPUs), formatCPUList(s.RouterCPUs))
	}
	w("Setup: %d CPUs%s; %s; %s. ", s.NumCPU, paren(s.CPUModel), place, s.GoVersion)
	if s.NginxVersion != "" {
		w("%s with worker_processes auto (%d workers), upstream keepalive, proxy_http_version 1.1, Connection \"\", proxy_buffering off. ", s.NginxVersion, s.NginxWorkers)
	}
	if s.KvrouteLog == logAccess {
		w("kvroute runs as `kvroute serve` in its own process with **log.level info**: an access line per request, to a file; nginx writes its access log too (combined format, unbuffered, to a file). ")
	} else {
		w("kvroute runs as `kvroute serve` in its own process with **log.level %s**: access lines are logged at info, so none is written, and nginx's access log is off. ", s.KvrouteLog)
	}
	w("Load average before %s, after %s.\n\n", loadavg(s.LoadAvgBefore), loadavg(s.LoadAvgAfter))
	w("*Router CPU* is the router's CPU time over the window (100%% = one core), also per request; *driver CPU* likewise for the load generator and upstreams.\n\n")

	for _, sc := range Scenarios {
		rows := r.rows(sc)
		if len(rows) == 0 {
			continue
		}
		switch sc {
		case ScenarioSmall:
			w("### small: one short user message, non-streaming\n\n")
		case ScenarioMultiTurn:
			mean := 0.0
			if x := r.find(sc, s.Concurrency, TargetDirect); x != nil {
				mean = x.MeanBodyBytes
			}
			w("### multiturn: %d conversations growing to %s (mean body %s), non-streaming\n\n", s.Concurrency, kib(float64(s.MultiTurnBytes)), kib(mean))
		case ScenarioStream:
			w("### stream: %d SSE events %s apart per response, the head sent first; latency per event is arrival − emission\n\n", s.StreamEvents, dur(s.StreamGapMs/1000))
		case ScenarioManyStreams:
			w("### manystreams: %d concurrent streams of %d SSE events %s apart, the head sent first, started spread over %s; latency per event is arrival − emission\n\n",
				s.ManyStreams, s.StreamEvents, dur(s.ManyStreamsGapMs/1000), dur(s.ManyStreamsSpreadMs/1000))
		}
		if isStream(sc) {
			w("| C | router | streams/s | event p50 ms | event p99 ms | added p50 ms | added p99 ms | router CPU | router µs/event | driver CPU | errors |\n")
			w("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		} else {
			w("| C | router | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | router CPU | router µs/req | driver CPU | errors |\n")
			w("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		}
		for _, x := range rows {
			if x.Error != "" {
				w("| %d | %s | failed: %s |||||||||\n", x.Concurrency, x.Target, oneLine(x.Error))
				continue
			}
			lat, added := x.LatencyMs, x.AddedMs
			if isStream(sc) && x.EventMs != nil {
				lat, added = *x.EventMs, x.EventAddedMs
			}
			cpu, per := "—", "—"
			if x.Target != TargetDirect {
				cpu, per = fmt.Sprintf("%.0f%%", 100*x.RouterCPU), fmt.Sprintf("%.1f", cpuPerOp(&x))
			}
			w("| %d | %s | %.0f | %.3f | %.3f | %s | %s | %s | %s | %.0f%% | %d |\n", x.Concurrency, x.Target, x.RPS,
				lat.P50, lat.P99, delta(added, false), delta(added, true), cpu, per, 100*x.DriverCPU, x.Errors)
		}
		w("\n")
		listed := false
		for _, x := range rows {
			if len(x.Rounds) < 2 {
				continue
			}
			listed = true
			var parts []string
			for _, rf := range x.Rounds {
				if isStream(sc) {
					parts = append(parts, fmt.Sprintf("event p50 %.3f p99 %.3f ms", rf.EventP50Ms, rf.EventP99Ms))
					continue
				}
				if x.Target == TargetDirect {
					parts = append(parts, fmt.Sprintf("%.0f", rf.RPS))
				} else {
					parts = append(parts, fmt.Sprintf("%.0f (%.1f µs)", rf.RPS, rf.RouterCPUPerOp))
				}
			}
			paired := ""
			if p := x.EventAddedP99Paired; p != nil {
				paired = fmt.Sprintf("; added p99 against direct's same round: median %+.3f ms, range %+.3f to %+.3f", p.Median, p.Min, p.Max)
			}
			w("- C=%d %s, rounds in run order: %s%s\n", x.Concurrency, x.Target, strings.Join(parts, ", "), paired)
		}
		if listed {
			w("\n")
		}
	}
	if len(r.Checks) > 0 {
		w("### Targets\n\n")
		for _, c := range r.Checks {
			mark := "❌ missed"
			if c.OK {
				mark = "✅ holds"
			}
			w("- %s — **%s**: %s\n", mark, c.Target, c.Got)
		}
		w("\n")
	}
	for _, x := range r.Results {
		if x.FirstError != "" {
			w("- %s %s C=%d: %d errors, first: %s\n", x.Scenario, x.Target, x.Concurrency, x.Errors, oneLine(x.FirstError))
		}
	}
	for _, n := range r.Notes {
		w("- %s\n", n)
	}
	return b.String()
}

// rows returns the results of scenario, by concurrency (as run) then target.
func (r *Report) rows(scenario string) []Result {
	var out []Result
	for _, x := range r.Results {
		if x.Scenario == scenario {
			out = append(out, x)
		}
	}
	slices.SortStableFunc(out, func(a, b Result) int {
		if a.Concurrency != b.Concurrency {
			return b.Concurrency - a.Concurrency
		}
		return slices.Index(Targets, a.Target) - slices.Index(Targets, b.Target)
	})
	return out
}

func delta(p *Percentiles, p99 bool) string {
	if p == nil {
		return "—"
	}
	if p99 {
		return fmt.Sprintf("%+.3f", p.P99)
	}
	return fmt.Sprintf("%+.3f", p.P50)
}

func dur(seconds float64) string {
	return time.Duration(seconds * float64(time.Second)).String()
}

func kib(b float64) string {
	return fmt.Sprintf("%.1f KiB", b/1024)
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func loadavg(l [3]float64) string {
	return fmt.Sprintf("%.2f %.2f %.2f", l[0], l[1], l[2])
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return strings.ReplaceAll(s, "|", "\\|")
}
