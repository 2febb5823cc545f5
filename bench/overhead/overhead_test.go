package overhead

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"

	"github.com/kvroute/kvroute/bench/runner"
)

// serveArg makes the test binary serve kvroute, standing in for
// `kvroute serve`: TestMain runs it before any test when os.Args[1] is it.
const serveArg = "overhead-test-serve-kvroute"

func TestMain(m *testing.M) { kvtest.Main(m, serveArg) }

// testOptions are options for a short run at 2 connections, without CPU
// placement, with this test binary serving kvroute: measured runs of d
// after warm-ups of d/3.
func testOptions(d time.Duration, notes io.Writer) Options {
	o := DefaultOptions()
	o.Duration, o.Warmup = d, d/3
	o.Concurrency, o.LowConcurrency = 2, 0
	o.CPUs = "none"
	o.KvrouteCommand = []string{os.Args[0], serveArg}
	o.Notes = notes
	return o
}

// Every scenario against every target for a moment, at low concurrency:
// all requests succeed, every streamed event arrives, and the table and
// the JSON are written.
func TestRunShort(t *testing.T) {
	out := t.TempDir()
	var notes strings.Builder
	o := testOptions(700*time.Millisecond, &notes)
	o.StreamEvents = 10
	o.StreamGap = time.Millisecond
	o.ManyStreams, o.ManyStreamsGap = 12, 5*time.Millisecond
	o.MultiTurnBytes = 8 << 10
	o.Out = out

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	rep, err := Run(ctx, o)
	t.Log(notes.String())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{TargetDirect, TargetRoundRobin, TargetCacheAware}
	if _, err := runner.FindBinary("", "nginx"); err == nil {
		want = append(want, TargetNginx)
	} else {
		t.Logf("nginx parts skipped: %v", err)
	}
	if len(rep.Results) != len(Scenarios)*len(want) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(Scenarios)*len(want))
	}
	for _, r := range rep.Results {
		if !slices.Contains(want, r.Target) {
			t.Errorf("unexpected target %s", r.Target)
		}
		if r.Error != "" || r.Errors != 0 || r.Requests == 0 {
			t.Errorf("%s %s: %d requests, %d errors (%s %s)", r.Scenario, r.Target, r.Requests, r.Errors, r.Error, r.FirstError)
		}
		if r.Scenario == ScenarioManyStreams && r.Concurrency != o.ManyStreams {
			t.Errorf("%s %s: ran at C=%d, want %d", r.Scenario, r.Target, r.Concurrency, o.ManyStreams)
		}
		// Events count by arrival: every event of the streams inside the window, and some of those across its edges.
		if isStream(r.Scenario) && (r.EventMs == nil || r.Events < r.Requests*int64(o.StreamEvents)) {
			t.Errorf("%s: %d events for %d streams", r.Target, r.Events, r.Requests)
		}
		if r.Scenario == ScenarioMultiTurn && (r.MeanBodyBytes < 2048 || r.MeanBodyBytes > float64(o.MultiTurnBytes)) {
			t.Errorf("%s: multiturn mean body %.0f bytes", r.Target, r.MeanBodyBytes)
		}
		if r.Target != TargetDirect && r.AddedMs == nil {
			t.Errorf("%s %s: no added latency", r.Scenario, r.Target)
		}
	}

	md, err := os.ReadFile(filepath.Join(out, FileMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"### small", "### multiturn", "### stream", "### manystreams: 12 concurrent streams", "started spread over 50ms", "with 12 concurrent streams", "### Targets", "log.level info", "| 2 | kvroute/cache_aware |"} {
		if !strings.Contains(string(md), s) {
			t.Errorf("overhead.md lacks %q:\n%s", s, md)
		}
	}
	// log.level info (the default): both routers wrote an access line per request.
	logs := map[string]string{"kvroute-round_robin/kvroute.log": `"msg":"request"`}
	if slices.Contains(want, TargetNginx) {
		logs["nginx-round_robin/access.log"] = `"POST /v1/chat/completions HTTP/1.1" 200`
	}
	for file, line := range logs {
		b, err := os.ReadFile(filepath.Join(out, "routers", file))
		if err != nil || !strings.Contains(string(b), line) {
			t.Errorf("%s: no access line %s (%v)", file, line, err)
		}
	}
	var back Report
	js, err := os.ReadFile(filepath.Join(out, FileJSON))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(rep.Results) || len(back.Checks) == 0 {
		t.Errorf("overhead.json: %d results, %d checks", len(back.Results), len(back.Checks))
	}
	t.Log("\n" + string(md))
}

// The manystreams scenario spreads its first requests over one stream's
// length unless told otherwise, and only that scenario spreads them.
func TestManyStreamsSpread(t *testing.T) {
	for _, c := range []struct {
		name     string
		scenario string
		spread   time.Duration
		want     time.Duration
	}{
		{"default is one stream", ScenarioManyStreams, 0, 10 * 5 * time.Millisecond},
		{"explicit", ScenarioManyStreams, 5 * time.Millisecond, 5 * time.Millisecond},
		{"other scenarios start at once", ScenarioStream, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := DefaultOptions()
			o.StreamEvents, o.ManyStreamsGap, o.ManyStreamsSpread = 10, 5*time.Millisecond, c.spread
			o, _, err := o.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			s := loadSpec{scenario: c.scenario, opts: &o}
			if got := s.startSpread(); got != c.want {
				t.Errorf("spread %v, want %v", got, c.want)
			}
		})
	}
	o := DefaultOptions()
	o.ManyStreamsSpread = -time.Second
	if _, _, err := o.withDefaults(); err == nil {
		t.Error("a negative spread was accepted")
	}
}

// The multi-turn generator grows each conversation turn by turn and
// restarts it before a body would pass the limit.
func TestMultiTurnGen(t *testing.T) {
	g := newMultiTurnGen(1, 0, 8<<10)
	var last int
	restarts := 0
	for range 100 {
		b := g.next()
		if len(b) > 8<<10 {
			t.Fatalf("body of %d bytes above the limit", len(b))
		}
		var v struct {
			Messages []struct{ Role, Content string }
		}
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("bad body: %v", err)
		}
		if len(b) < last {
			restarts++
			if len(v.Messages) != 2 {
				t.Fatalf("restarted conversation has %d messages", len(v.Messages))
			}
		}
		last = len(b)
		g.answered(true)
	}
	if restarts < 3 {
		t.Errorf("%d restarts in 100 turns", restarts)
	}
}

func TestParseCPUList(t *testing.T) {
	got, err := parseCPUList("0-2,5")
	if err != nil || !slices.Equal(got, []int{0, 1, 2, 5}) {
		t.Errorf("got %v, %v", got, err)
	}
	if _, err := parseCPUList("2-1"); err == nil {
		t.Error("2-1 accepted")
	}
	if p, _, err := resolvePlacement("none"); err != nil || p.pinned() {
		t.Errorf("none: %v %v", p, err)
	}
}

func TestRoundOrder(t *testing.T) {
	for _, tc := range []struct {
		n, round int
		want     []int
	}{
		{3, 0, []int{0, 1, 2}},
		{3, 1, []int{2, 1, 0}},
		{3, 2, []int{0, 1, 2}},
		{1, 1, []int{0}},
		{0, 0, []int{}},
	} {
		if got := roundOrder(tc.n, tc.round); !slices.Equal(got, tc.want) {
			t.Errorf("roundOrder(%d, %d) = %v, want %v", tc.n, tc.round, got, tc.want)
		}
	}
}

func TestMedianRound(t *testing.T) {
	r := func(rps, cpu float64, errs int64) Result {
		return Result{Target: TargetRoundRobin, RPS: rps, RouterCPUPerOp: cpu, Errors: errs}
	}
	stream := func(x Result, p99 float64) Result {
		x.Scenario, x.EventMs = ScenarioManyStreams, &Percentiles{P50: p99 / 2, P99: p99}
		return x
	}
	for _, tc := range []struct {
		name    string
		rounds  []Result
		wantRPS float64
		wantCPU float64 // cpuPerOp of the result
		errs    int64
	}{
		{"one round, no list", []Result{r(10, 5, 1)}, 10, 5, 1},
		{"odd: middle by req/s", []Result{r(30, 1, 0), r(10, 9, 1), r(20, 4, 0)}, 20, 4, 1},
		{"even: lower middle, CPU mean of the middle two", []Result{r(40, 2, 0), r(10, 8, 0), r(30, 4, 2), r(20, 6, 0)}, 20, 5, 2},
		// Streams: req/s is the upstreams' pace, the middle is by event p99.
		{"stream: middle by event p99", []Result{stream(r(30, 1, 0), 9), stream(r(10, 2, 0), 1), stream(r(20, 3, 0), 5)}, 20, 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := medianRound(tc.rounds)
			if m.RPS != tc.wantRPS || cpuPerOp(&m) != tc.wantCPU || m.Errors != tc.errs {
				t.Errorf("got req/s %v, CPU %v, errors %d; want %v, %v, %d", m.RPS, cpuPerOp(&m), m.Errors, tc.wantRPS, tc.wantCPU, tc.errs)
			}
			if len(tc.rounds) > 1 && len(m.Rounds) != len(tc.rounds) {
				t.Errorf("%d rounds listed, want %d", len(m.Rounds), len(tc.rounds))
			}
			for i, rf := range m.Rounds {
				if rf.RPS != tc.rounds[i].RPS {
					t.Errorf("round %d listed as %v req/s, ran at %v", i, rf.RPS, tc.rounds[i].RPS)
				}
				if e := tc.rounds[i].EventMs; e != nil && rf.EventP99Ms != e.P99 {
					t.Errorf("round %d listed with event p99 %v, ran at %v", i, rf.EventP99Ms, e.P99)
				}
			}
		})
	}
}

// Rounds: each target runs once per round, in alternating order, and the
// report keeps every round's figures.
func TestRunRounds(t *testing.T) {
	var notes strings.Builder
	o := testOptions(300*time.Millisecond, &notes)
	o.Rounds = 3
	o.Scenarios = []string{ScenarioSmall}
	o.Targets = []string{"round_robin"}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("%d results, want 2", len(rep.Results))
	}
	for _, x := range rep.Results {
		if len(x.Rounds) != 3 || x.Errors != 0 || x.Requests == 0 {
			t.Errorf("%s: %d rounds, %d errors, %d requests", x.Target, len(x.Rounds), x.Errors, x.Requests)
		}
	}
	var order []string
	for _, line := range strings.Split(notes.String(), "\n") {
		if strings.HasPrefix(line, ScenarioSmall) {
			order = append(order, strings.Fields(line)[2])
		}
	}
	want := []string{TargetDirect, TargetRoundRobin, TargetRoundRobin, TargetDirect, TargetDirect, TargetRoundRobin}
	if !slices.Equal(order, want) {
		t.Errorf("run order %v, want %v", order, want)
	}
	if md := rep.Markdown(); !strings.Contains(md, "3 rounds") || !strings.Contains(md, "kvroute/round_robin, rounds in run order: ") {
		t.Errorf("report lacks the rounds:\n%s", md)
	}
}

// The throughput targets count capacity only from rounds where both
// routers saturated their core.
func TestThroughputChecks(t *testing.T) {
	rf := func(rps, cores, us float64) RoundFigures {
		return RoundFigures{RPS: rps, RouterCPU: cores, RouterCPUPerOp: us}
	}
	res := func(target string, rounds ...RoundFigures) Result {
		m := rounds[(len(rounds)-1)/2] // callers list the median req/s round there
		return Result{Scenario: ScenarioMultiTurn, Concurrency: 64, Target: target, Requests: 1,
			RPS: m.RPS, RouterCPU: m.RouterCPU, RouterCPUPerOp: m.RouterCPUPerOp, Rounds: rounds}
	}
	for _, tc := range []struct {
		name   string
		rr, ca Result
		ok     bool
		n      int
		ratio  float64
	}{
		{
			"driver-bound rounds flatter cache_aware: not held",
			res(TargetRoundRobin, rf(16000, 0.95, 58), rf(11000, 0.80, 75), rf(11500, 0.84, 73)),
			res(TargetCacheAware, rf(11000, 0.98, 90), rf(10900, 0.97, 88), rf(11200, 0.97, 86)),
			false, 1, 58.0 / 90,
		},
		{
			"capacity and req/s both at least 0.8",
			res(TargetRoundRobin, rf(16000, 0.95, 60), rf(16500, 0.96, 58), rf(15000, 0.97, 62)),
			res(TargetCacheAware, rf(14000, 0.96, 70), rf(14500, 0.97, 68), rf(13500, 0.98, 72)),
			true, 3, 60.0 / 70,
		},
		{
			"no saturated round: req/s alone",
			res(TargetRoundRobin, rf(10000, 0.5, 50)),
			res(TargetCacheAware, rf(9000, 0.6, 60)),
			true, 0, 0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ratio, n := saturatedCapacity(&tc.ca, &tc.rr)
			if n != tc.n || math.Abs(ratio-tc.ratio) > 1e-9 {
				t.Errorf("saturatedCapacity = %v over %d rounds, want %v over %d", ratio, n, tc.ratio, tc.n)
			}
			rep := &Report{Setup: Setup{Concurrency: 64}, Results: []Result{tc.rr, tc.ca}}
			rep.evaluate()
			if len(rep.Checks) != 1 || rep.Checks[0].OK != tc.ok {
				t.Fatalf("checks %+v, want one with OK=%v", rep.Checks, tc.ok)
			}
		})
	}
}

// The many-streams target judges the added p99 round by round: a router
// whose rounds beat the driver's noisiest round is not credited for it.
func TestPairedStreamCheck(t *testing.T) {
	ev := func(p99s ...float64) []RoundFigures {
		v := make([]RoundFigures, len(p99s))
		for i, p := range p99s {
			v[i] = RoundFigures{EventP50Ms: 0.3, EventP99Ms: p}
		}
		return v
	}
	res := func(target string, rounds []RoundFigures, p99 float64) Result {
		return Result{Scenario: ScenarioManyStreams, Concurrency: 1000, Target: target, Requests: 1,
			EventMs: &Percentiles{P50: 0.3, P99: p99}, Rounds: rounds}
	}
	for _, tc := range []struct {
		name            string
		direct, router  []float64
		medDirect, medR float64 // the rows' own p99s (median req/s rounds)
		ok              bool
		median          float64
	}{
		// Unpaired, the rows give 14 − 40 = −26 ms: the driver's noise.
		{"router slower in every round", []float64{4, 40, 5}, []float64{10, 46, 9}, 40, 14, false, 6},
		{"under a millisecond in most rounds", []float64{4, 6, 5}, []float64{4.5, 9, 5.2}, 5, 5.2, true, 0.5},
		{"one round only: the rows", []float64{4}, []float64{4.4}, 4, 4.4, true, 0.4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rounds := func(v []float64) []RoundFigures {
				if len(v) < 2 {
					return nil
				}
				return ev(v...)
			}
			rep := &Report{Setup: Setup{Concurrency: 64, ManyStreams: 1000}, Results: []Result{
				res(TargetDirect, rounds(tc.direct), tc.medDirect),
				res(TargetRoundRobin, rounds(tc.router), tc.medR),
			}}
			rep.addDeltas()
			rep.evaluate()
			if len(rep.Checks) != 1 || rep.Checks[0].OK != tc.ok {
				t.Fatalf("checks %+v, want one with OK=%v", rep.Checks, tc.ok)
			}
			if got, _ := addedP99(&rep.Results[1]); math.Abs(got-tc.median) > 1e-9 {
				t.Errorf("added p99 %v, want %v", got, tc.median)
			}
		})
	}
}

// A streamed request's body sets its upstream's pause between events.
func TestBodyGap(t *testing.T) {
	g := &smallGen{stream: true, maxTokens: 5, gap: 40 * time.Millisecond}
	for _, tc := range []struct {
		body string
		want time.Duration
		ok   bool
	}{
		{string(g.next()), 40 * time.Millisecond, true},
		{`{"stream":true,"overhead_gap_us":1500}`, 1500 * time.Microsecond, true},
		{`{"stream":true}`, 0, false},
		{`{"overhead_gap_us":x}`, 0, false},
	} {
		got, ok := bodyGap([]byte(tc.body))
		if got != tc.want || ok != tc.ok {
			t.Errorf("bodyGap(%s) = %v, %v; want %v, %v", tc.body, got, ok, tc.want, tc.ok)
		}
	}
}

// A fresh stream's events, its last with [DONE], allocate nothing between
// their stamps and their writes, and each parses back to its stamp.
func TestEventStreamDoesNotAllocate(t *testing.T) {
	const events, runs = 50, 20
	streams := make([]*eventStream, runs+1) // AllocsPerRun calls once more
	for i := range streams {
		streams[i] = newEventStream(events, 0)
	}
	k := 0
	allocs := testing.AllocsPerRun(runs, func() {
		es := streams[k]
		k++
		for range events {
			es.next()
		}
	})
	if allocs != 0 {
		t.Errorf("a stream's %d events allocated %.1f times", events, allocs)
	}
	es := newEventStream(2, 0)
	for i := range 2 {
		before := time.Now().UnixNano()
		b := es.next()
		j := bytes.LastIndex(b, tKey)
		if j < 0 {
			t.Fatalf("event %d without a stamp: %q", i, b)
		}
		stamp, ok := parseStamp(b[j+len(tKey):])
		if !ok || stamp < before || stamp > time.Now().UnixNano() {
			t.Errorf("event %d: stamp %d (ok %v) not within its call: %q", i, stamp, ok, b)
		}
		if done, last := bytes.HasSuffix(b, eventDone), i == 1; done != last {
			t.Errorf("event %d of 2: [DONE] at its end %v, want %v", i, done, last)
		}
	}
}

// With CPUProfile, every kvroute run and every run's load generator leave
// a CPU profile.
func TestRunCPUProfile(t *testing.T) {
	out := t.TempDir()
	var notes strings.Builder
	o := testOptions(300*time.Millisecond, &notes)
	o.Scenarios, o.Targets = []string{ScenarioSmall}, []string{"round_robin"}
	o.CPUProfile = true
	o.Out = out
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if _, err := Run(ctx, o); err != nil {
		t.Fatalf("%v\n%s", err, notes.String())
	}
	for _, path := range []string{
		filepath.Join(out, "routers", "kvroute-round_robin", "cpu-small-c2-r1.pprof"),
		filepath.Join(out, "driver-kvroute-round_robin-small-c2-r1.pprof"),
		filepath.Join(out, "driver-direct-small-c2-r1.pprof"),
	} {
		if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s: %v (notes: %s)", path, err, notes.String())
		}
	}
}

// A baseline build is measured beside kvroute: each kvroute target gets a
// baseline/ twin, run by BaselineCommand, just before it in every round,
// and both are in the report.
func TestBaselineTwins(t *testing.T) {
	o := DefaultOptions()
	o.Targets = []string{"round_robin", "cache_aware"}
	o.BaselineCommand = []string{"old-kvroute", "serve"}
	o, _, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{TargetDirect, BaselinePrefix + "round_robin", TargetRoundRobin, BaselinePrefix + "cache_aware", TargetCacheAware}
	if !slices.Equal(o.Targets, want) {
		t.Fatalf("targets %v, want %v", o.Targets, want)
	}

	var notes strings.Builder
	o = testOptions(300*time.Millisecond, &notes)
	o.Scenarios = []string{ScenarioSmall}
	o.Targets = []string{"round_robin"}
	o.BaselineCommand = o.KvrouteCommand
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := Run(ctx, o)
	t.Log(notes.String())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rep.Results {
		got[r.Target] = r.Requests > 0 && r.Errors == 0
	}
	for _, target := range []string{TargetDirect, BaselinePrefix + "round_robin", TargetRoundRobin} {
		if !got[target] {
			t.Errorf("target %s: no clean result in %v", target, got)
		}
	}
}
