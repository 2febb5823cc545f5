package overhead

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/runner"
)

// Run runs the benchmark: it starts the upstreams and every target, then
// for each scenario and concurrency runs each target in turn (interleaved,
// so slow drift of the machine touches all alike), and returns the report,
// also written into o.Out when set. A run cut short by ctx returns what it
// has with ctx's error.
func Run(ctx context.Context, o Options) (*Report, error) {
	o, explicit, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	notes := o.Notes
	if notes == nil {
		notes = io.Discard
	}
	rep := &Report{Started: time.Now(), Setup: Setup{
		Duration: o.Duration.Seconds(), Warmup: o.Warmup.Seconds(), Rounds: o.Rounds, Concurrency: o.Concurrency, LowConcurrency: o.LowConcurrency,
		Upstreams: o.Upstreams, StreamEvents: o.StreamEvents, StreamGapMs: float64(o.StreamGap) / 1e6, MultiTurnBytes: o.MultiTurnBytes,
		ManyStreams: o.ManyStreams, ManyStreamsGapMs: float64(o.ManyStreamsGap) / 1e6,
		ManyStreamsSpreadMs: float64(o.ManyStreamsSpread) / 1e6,
		GoVersion:           runtime.Version(), CPUModel: cpuModel(), NumCPU: runtime.NumCPU(), KvrouteLog: o.LogLevel,
	}}
	note := func(format string, args ...any) {
		s := fmt.Sprintf(format, args...)
		rep.Notes = append(rep.Notes, s)
		_, _ = fmt.Fprintln(notes, s)
	}
	progress := func(format string, args ...any) { _, _ = fmt.Fprintf(notes, format+"\n", args...) }

	// Where files go.
	dir := o.Out
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvroute-overhead-"); err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(dir) }()
	}
	routersDir := filepath.Join(dir, "routers")

	// Which routers, and where everything runs.
	var nginxBin string
	if slices.Contains(o.Targets, TargetNginx) {
		if nginxBin, err = runner.FindBinary(o.NginxPath, "nginx"); err != nil {
			if explicit[TargetNginx] || o.NginxPath != "" {
				return nil, err
			}
			note("%s skipped: %v", TargetNginx, err)
			o.Targets = slices.DeleteFunc(o.Targets, func(t string) bool { return t == TargetNginx })
		} else {
			rep.Setup.NginxVersion = nginxVersion(nginxBin)
		}
	}
	command := o.KvrouteCommand
	if len(command) == 0 {
		if command, err = defaultKvrouteCommand(); err != nil {
			return nil, err
		}
	}
	place, why, err := resolvePlacement(o.CPUs)
	if err != nil {
		return nil, err
	}
	if why != "" {
		note("%s", why)
	}
	routerCPUs := ""
	if place.pinned() {
		restore, err := pinSelf(place.Driver, o.DriverProcsPerCPU*len(place.Driver))
		if err != nil {
			return nil, fmt.Errorf("pin the driver to CPUs %s: %w", formatCPUList(place.Driver), err)
		}
		defer restore()
		rep.Setup.DriverCPUs, rep.Setup.RouterCPUs = place.Driver, place.Router
		routerCPUs = formatCPUList(place.Router)
	}
	rep.Setup.DriverProcs = runtime.GOMAXPROCS(0)

	ups, err := startUpstreams(o.Upstreams, o.StreamEvents, o.StreamGap)
	if err != nil {
		return nil, err
	}
	defer ups.Close()

	// Start every router up front; the idle ones cost next to nothing.
	type target struct {
		name  string
		addr  string
		dir   string // its files, under routers/
		child *router
		err   error
	}
	var targets []*target
	defer func() {
		for _, t := range targets {
			if t.child != nil {
				t.child.Stop()
			}
		}
	}()
	for _, name := range o.Targets {
		t := &target{name: name}
		targets = append(targets, t)
		if name == TargetDirect {
			t.addr = ups.addrs[0]
			continue
		}
		tdir := filepath.Join(routersDir, strings.ReplaceAll(name, "/", "-"))
		t.dir = tdir
		if err := os.MkdirAll(tdir, 0o755); err != nil {
			return nil, err
		}
		if name == TargetNginx {
			t.child, t.err = startNginx(ctx, nginxBin, tdir, routerCPUs, ups.URLs(), o.LogLevel == logAccess)
		} else if name == TargetFloor {
			t.child, t.err = startFloor(ctx, tdir, routerCPUs, ups.URLs())
		} else if policy, ok := strings.CutPrefix(name, BaselinePrefix); ok {
			t.child, t.err = startKvroute(ctx, o.BaselineCommand, policy, o.LogLevel, tdir, routerCPUs, ups.URLs(), o.CPUProfile)
		} else {
			t.child, t.err = startKvroute(ctx, command, strings.TrimPrefix(name, kvroutePrefix), o.LogLevel, tdir, routerCPUs, ups.URLs(), o.CPUProfile)
		}
		if t.err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			note("%s did not start: %v", name, t.err)
			continue
		}
		t.addr = t.child.addr
		if name == TargetNginx {
			_, rep.Setup.NginxWorkers = treeCPU(t.child.pid())
		}
		progress("started %s on %s (pid %d)", name, t.addr, t.child.pid())
	}

	rep.Setup.LoadAvgBefore = loadAvg()
	run := 0
	var runErr error
	// measure runs one round of t at scenario sc and concurrency conc.
	measure := func(t *target, sc string, conc, round int) (Result, error) {
		res := Result{Scenario: sc, Concurrency: conc, Target: t.name}
		run++
		var routerAt, selfAt [2]time.Duration
		profiled, profiling := make(chan error, 1), false
		var stopDriverProfile func()
		defer func() {
			if stopDriverProfile != nil {
				stopDriverProfile()
			}
		}()
		profile := o.CPUProfile && t.child != nil && t.child.admin != ""
		sample := func(i int) func() {
			return func() {
				if t.child != nil {
					routerAt[i], _ = treeCPU(t.child.pid())
				}
				selfAt[i] = selfCPU()
				if o.CPUProfile && i == 0 {
					stopDriverProfile = startDriverProfile(filepath.Join(dir, fmt.Sprintf("driver-%s-%s-c%d-r%d.pprof", strings.ReplaceAll(t.name, "/", "-"), sc, conc, round+1)))
				}
				if i == 1 && stopDriverProfile != nil {
					stopDriverProfile()
					stopDriverProfile = nil
				}
				if i == 0 && profile {
					profiling = true
					path := filepath.Join(t.dir, fmt.Sprintf("cpu-%s-c%d-r%d.pprof", sc, conc, round+1))
					go func() { profiled <- t.child.cpuProfile(o.Duration, path) }()
				}
			}
		}
		lr, err := drive(ctx, loadSpec{
			addr: t.addr, scenario: sc, concurrency: conc, run: run, warmup: o.Warmup, duration: o.Duration,
			events: o.StreamEvents, opts: &o, atStart: sample(0), atEnd: sample(1),
		})
		fill(&res, lr, routerAt, selfAt)
		if err != nil {
			return res, err
		}
		if profiling {
			if perr := <-profiled; perr != nil {
				note("%s %s C=%d round %d: CPU profile: %v", t.name, sc, conc, round+1, perr)
			}
		}
		lat, unit := res.LatencyMs, "req/s"
		if isStream(sc) {
			lat, unit = *res.EventMs, "streams/s"
		}
		progress("%-11s C=%-4d %-20s round %d/%d %8.0f %s  p50 %.3f ms p99 %.3f ms  router CPU %3.0f%%  errors %d",
			sc, conc, t.name, round+1, o.Rounds, res.RPS, unit, lat.P50, lat.P99, 100*res.RouterCPU, res.Errors)
		// Let the closed connections' teardown pass before the next run.
		time.Sleep(100 * time.Millisecond)
		return res, nil
	}
	for _, sc := range o.Scenarios {
		for _, conc := range o.concurrencies(sc) {
			rounds := make([][]Result, len(targets))
		comparison:
			for round := range o.Rounds {
				for _, i := range roundOrder(len(targets), round) {
					if targets[i].err != nil {
						continue
					}
					res, err := measure(targets[i], sc, conc, round)
					rounds[i] = append(rounds[i], res)
					if err != nil {
						runErr = err
						break comparison
					}
				}
			}
			// What an interrupted comparison measured is kept too.
			for i, t := range targets {
				switch {
				case t.err != nil:
					rep.Results = append(rep.Results, Result{Scenario: sc, Concurrency: conc, Target: t.name, Error: t.err.Error()})
				case len(rounds[i]) > 0:
					rep.Results = append(rep.Results, medianRound(rounds[i]))
				}
			}
			if runErr != nil {
				break
			}
		}
		if runErr != nil {
			break
		}
	}
	rep.Setup.LoadAvgAfter = loadAvg()
	rep.addDeltas()
	rep.evaluate()
	rep.Wall = time.Since(rep.Started).Seconds()
	if o.Out != "" {
		if err := rep.WriteFiles(o.Out); err != nil {
			return rep, errors.Join(runErr, err)
		}
	}
	return rep, runErr
}

// roundOrder is the order n targets run in a round: as listed in even
// rounds, reversed in odd ones, so that a drift in the machine's speed
// favours no target over the rounds.
func roundOrder(n, round int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
		if round%2 == 1 {
			order[i] = n - 1 - i
		}
	}
	return order
}

// medianRound returns the round of one target with the median requests/s
// (the lower middle one of an even count), with the figures of every
// round in Rounds when there was more than one. A stream scenario's
// requests/s is set by its upstreams' pace, so there the median is by event
// p99. Errors add up over the rounds.
func medianRound(rounds []Result) Result {
	if len(rounds) == 0 {
		return Result{}
	}
	key := func(r Result) float64 {
		if r.EventMs != nil {
			return r.EventMs.P99
		}
		return r.RPS
	}
	sorted := slices.Clone(rounds)
	slices.SortStableFunc(sorted, func(a, b Result) int { return cmp.Compare(key(a), key(b)) })
	m := sorted[(len(sorted)-1)/2]
	if len(rounds) > 1 {
		m.Rounds = make([]RoundFigures, len(rounds))
		m.Errors = 0
		for i, r := range rounds {
			m.Rounds[i] = RoundFigures{RPS: r.RPS, RouterCPU: r.RouterCPU, RouterCPUPerOp: r.RouterCPUPerOp}
			if r.EventMs != nil {
				m.Rounds[i].EventP50Ms, m.Rounds[i].EventP99Ms = r.EventMs.P50, r.EventMs.P99
			}
			m.Errors += r.Errors
			if m.FirstError == "" {
				m.FirstError = r.FirstError
			}
		}
	}
	return m
}

// fill sets res from a load result and the CPU samples at the start and
// end of its window.
func fill(res *Result, lr *loadResult, router, self [2]time.Duration) {
	if lr == nil {
		return
	}
	res.Requests, res.Errors, res.FirstError, res.Seconds = lr.Requests, lr.Errors, lr.FirstErr, lr.Seconds
	if lr.Seconds > 0 {
		res.RPS = float64(lr.Requests) / lr.Seconds
		res.RouterCPU = (router[1] - router[0]).Seconds() / lr.Seconds
		res.DriverCPU = (self[1] - self[0]).Seconds() / lr.Seconds
	}
	if lr.Requests > 0 {
		res.MeanBodyBytes = float64(lr.BodyBytes) / float64(lr.Requests)
		res.RouterCPUPerOp = float64((router[1] - router[0]).Microseconds()) / float64(lr.Requests)
	}
	res.LatencyMs = percentiles(lr.Latency)
	if isStream(res.Scenario) {
		p := percentiles(lr.Events)
		res.EventMs = &p
		res.Events = int64(len(lr.Events))
		// Per event: streams longer than the window have events in it but
		// are not counted as requests.
		res.RouterCPUPerOp = 0
		if len(lr.Events) > 0 {
			res.RouterCPUPerOp = float64((router[1] - router[0]).Microseconds()) / float64(len(lr.Events))
		}
		if lr.Seconds > 0 {
			res.EventsPerSec = float64(len(lr.Events)) / lr.Seconds
		}
	}
}

// percentiles returns the nearest-rank percentiles of ns, in milliseconds.
func percentiles(ns []int64) Percentiles {
	if len(ns) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.999999) - 1
		i = max(0, min(i, len(s)-1))
		return float64(s[i]) / 1e6
	}
	return Percentiles{P50: at(0.50), P90: at(0.90), P99: at(0.99)}
}

// loadAvg reads the 1, 5 and 15 minute load averages.
func loadAvg() [3]float64 {
	var l [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return l
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		l[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return l
}

// cpuModel returns the first "model name" of /proc/cpuinfo, or "".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// startDriverProfile starts this process's CPU profile (the load
// generator's and upstreams' share of a run) into path, and returns what
// stops it, or nil when it could not start.
func startDriverProfile(path string) func() {
	f, err := os.Create(path)
	if err != nil {
		return nil
	}
	if pprof.StartCPUProfile(f) != nil {
		_ = f.Close()
		return nil
	}
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
	}
}
