package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/server"
)

// Output file names in Options.Out.
const (
	FileMarkdown = "chaos.md"
	FileJSON     = "chaos.json"
	FileLog      = "kvroute.log"
)

// PhaseNames names the timeline's phases, in order. The faults of phases 1
// to 4 accumulate; phase 5 ends them all.
var PhaseNames = []string{
	"normal",
	"kill sim-0",
	"+ hang sim-1",
	"+ 500s from sim-2",
	"+ garbage /metrics on sim-3",
	"restore all",
	"normal again",
}

// Options configures a chaos run. DefaultOptions gives a complete set; a
// zero field takes its default.
type Options struct {
	// Replicas is the number of simulated replicas, at least 4 (faults
	// strike replicas 0 to 3). Default 4.
	Replicas int `json:"replicas"`
	// Rate is the load in requests per second (fixed interval). Default 20.
	Rate float64 `json:"rate"`
	// Phase is the length of every phase. Default 3s.
	Phase time.Duration `json:"phase_ns"`
	// Phases, when set, gives each of the len(PhaseNames) phases its own
	// length, overriding Phase.
	Phases []time.Duration `json:"phases_ns,omitempty"`
	// StreamShare is the share of streamed requests (0–1). Default 0.5;
	// a negative value means none.
	StreamShare float64 `json:"stream_share"`
	// MaxTokens is max_tokens of every request. Default 128.
	MaxTokens int `json:"max_tokens"`
	// Users and Turns shape the multi-turn conversations the requests
	// cycle through. Defaults 16 and 8.
	Users int `json:"users"`
	Turns int `json:"turns"`
	// TimeScale multiplies the replicas' simulated time. Default 0.25.
	TimeScale float64 `json:"time_scale"`
	// RequestTimeout is the client's deadline per request; a request
	// running past it is lost. Default 20s.
	RequestTimeout time.Duration `json:"request_timeout_ns"`
	// Seed makes the conversations reproducible. Default 1.
	Seed uint64 `json:"seed"`

	// kvroute's settings (policy cache_aware).
	// Retries (retries). Default 1.
	Retries int `json:"retries"`
	// HealthInterval, HealthTimeout and FailThreshold (health.*). Defaults
	// 200ms, 500ms and 2.
	HealthInterval time.Duration `json:"health_interval_ns"`
	HealthTimeout  time.Duration `json:"health_timeout_ns"`
	FailThreshold  int           `json:"fail_threshold"`
	// FirstByte and StreamIdle (timeouts.*). Defaults 2s and 2s.
	FirstByte  time.Duration `json:"first_byte_ns"`
	StreamIdle time.Duration `json:"stream_idle_ns"`
	// LogLevel of kvroute's log (Out/kvroute.log). Default "warn".
	LogLevel string `json:"log_level"`
	// Disaggregated, "P:D", splits the replicas (P+D of them) into P
	// prefill and D decode replicas, both at least 3, paired in
	// Protocol: the prefill replicas are sim-0, sim-2, sim-4 ... first,
	// so that the faults strike both sides. Empty: every replica serves
	// whole requests.
	Disaggregated string `json:"disaggregated,omitempty"`
	// Protocol is the disaggregated fleet's protocol, vllm (default) or
	// sglang.
	Protocol string `json:"protocol,omitempty"`
	// LocalPrefillTokens is kvroute's disaggregation.local_prefill_tokens
	// in a vLLM split fleet: the conversations' later turns may go whole
	// to the decode replica holding their earlier ones. 0: never.
	LocalPrefillTokens int `json:"local_prefill_tokens,omitempty"`
	// LocalPrefillBacklog is kvroute's disaggregation.local_prefill_backlog
	// in a vLLM split fleet: while every prefill replica has that many
	// prompt tokens waiting, a decode replica may compute a prompt
	// itself. 0: never.
	LocalPrefillBacklog int `json:"local_prefill_backlog,omitempty"`

	// Out is the directory for chaos.md, chaos.json and kvroute.log; empty
	// writes nothing.
	Out string `json:"-"`
	// Notes receives a line per phase as the run goes; nil discards them.
	Notes io.Writer `json:"-"`
}

// DefaultOptions returns the defaults: 4 replicas, 20 req/s, 3 s phases.
func DefaultOptions() Options {
	return Options{
		Replicas:       4,
		Rate:           20,
		Phase:          3 * time.Second,
		StreamShare:    0.5,
		MaxTokens:      128,
		Users:          16,
		Turns:          8,
		TimeScale:      0.25,
		RequestTimeout: 20 * time.Second,
		Seed:           1,
		Retries:        1,
		HealthInterval: 200 * time.Millisecond,
		HealthTimeout:  500 * time.Millisecond,
		FailThreshold:  2,
		FirstByte:      2 * time.Second,
		StreamIdle:     2 * time.Second,
		LogLevel:       "warn",
	}
}

func (o Options) withDefaults() (Options, error) {
	d := DefaultOptions()
	setI := func(v *int, dv int) {
		if *v == 0 {
			*v = dv
		}
	}
	setD := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	setI(&o.Replicas, d.Replicas)
	setI(&o.MaxTokens, d.MaxTokens)
	setI(&o.Users, d.Users)
	setI(&o.Turns, d.Turns)
	setI(&o.FailThreshold, d.FailThreshold)
	setD(&o.Phase, d.Phase)
	setD(&o.RequestTimeout, d.RequestTimeout)
	setD(&o.HealthInterval, d.HealthInterval)
	setD(&o.HealthTimeout, d.HealthTimeout)
	setD(&o.FirstByte, d.FirstByte)
	setD(&o.StreamIdle, d.StreamIdle)
	o.Rate = cmp.Or(o.Rate, d.Rate)
	o.StreamShare = cmp.Or(o.StreamShare, d.StreamShare)
	if o.StreamShare < 0 {
		o.StreamShare = 0
	}
	o.TimeScale = cmp.Or(o.TimeScale, d.TimeScale)
	o.Seed = cmp.Or(o.Seed, d.Seed)
	o.LogLevel = cmp.Or(o.LogLevel, d.LogLevel)
	var errs []error
	if o.Replicas < 4 {
		errs = append(errs, fmt.Errorf("replicas must be at least 4 (faults strike replicas 0 to 3), got %d", o.Replicas))
	}
	if _, err := o.roles(); err != nil {
		errs = append(errs, err)
	}
	if o.Rate <= 0 || o.Rate > 10000 {
		errs = append(errs, fmt.Errorf("rate must be in (0, 10000] req/s, got %v", o.Rate))
	}
	if o.StreamShare > 1 {
		errs = append(errs, fmt.Errorf("stream share must be in [0, 1], got %v", o.StreamShare))
	}
	if o.TimeScale <= 0 {
		errs = append(errs, fmt.Errorf("time scale must be positive, got %v", o.TimeScale))
	}
	if len(o.Phases) != 0 && len(o.Phases) != len(PhaseNames) {
		errs = append(errs, fmt.Errorf("phases: want %d durations (%v), got %d", len(PhaseNames), PhaseNames, len(o.Phases)))
	}
	for _, p := range append([]time.Duration{o.Phase}, o.Phases...) {
		if p <= 0 {
			errs = append(errs, fmt.Errorf("phase durations must be positive, got %v", p))
		}
	}
	if o.Retries < 0 || o.Retries > 10 {
		errs = append(errs, fmt.Errorf("retries must be in [0, 10], got %d", o.Retries))
	}
	if o.MaxTokens < 1 || o.Users < 1 || o.Turns < 1 || o.FailThreshold < 1 {
		errs = append(errs, errors.New("max tokens, users, turns and fail threshold must be positive"))
	}
	if _, err := zapcore.ParseLevel(o.LogLevel); err != nil {
		errs = append(errs, fmt.Errorf("log level: %w", err))
	}
	return o, errors.Join(errs...)
}

// phaseLen is phase i's length.
func (o *Options) phaseLen(i int) time.Duration {
	if len(o.Phases) == len(PhaseNames) {
		return o.Phases[i]
	}
	return o.Phase
}

// kvrouteConfig is kvroute's configuration for the run: the defaults (no
// environment overrides: the run is about these settings), cache_aware,
// the replicas sim-0 ... sim-n-1 and the options' health and timeouts.
func (o *Options) kvrouteConfig(urls []string) (*config.Config, error) {
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = ""
	cfg.Policy = "cache_aware"
	roles, err := o.roles()
	if err != nil {
		return nil, err
	}
	for i, u := range urls {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: replicaName(i), URL: u, Engine: "vllm"})
		if roles != nil {
			cfg.Backends[i].Role = roles[i]
			cfg.Disaggregation.Protocol = cmp.Or(o.Protocol, config.ProtocolVLLM)
			// Validate refuses these with sglang.
			cfg.Disaggregation.LocalPrefillTokens, cfg.Disaggregation.LocalPrefillBacklog = o.LocalPrefillTokens, o.LocalPrefillBacklog
		}
	}
	cfg.Retries = o.Retries
	cfg.Health.Interval = o.HealthInterval
	cfg.Health.Timeout = o.HealthTimeout
	cfg.Health.FailThreshold = o.FailThreshold
	cfg.Timeouts.Connect = time.Second
	cfg.Timeouts.FirstByte = o.FirstByte
	cfg.Timeouts.StreamIdle = o.StreamIdle
	cfg.Timeouts.Drain = 5 * time.Second
	cfg.Timeouts.DrainDelay = 0 // nothing balances onto a benchmark instance: stop at once
	cfg.Metrics.Interval = 100 * time.Millisecond
	cfg.Metrics.Timeout = 500 * time.Millisecond
	cfg.Log.Level = o.LogLevel
	return cfg, cfg.Validate()
}

func replicaName(i int) string { return "sim-" + strconv.Itoa(i) }

// roles returns each replica's role under o.Disaggregated (nil when not
// set): prefill on the even replicas first (sim-0, sim-2, ...), then on
// the last ones if P is more than half.
func (o *Options) roles() ([]string, error) {
	if o.Disaggregated == "" {
		return nil, nil
	}
	if err := config.CheckProtocol(o.Protocol); err != nil {
		return nil, fmt.Errorf("protocol: %w", err)
	}
	p, d, err := sim.ParseSplit(o.Disaggregated)
	if err != nil {
		return nil, fmt.Errorf("disaggregated: %w", err)
	}
	if p < 3 || d < 3 || p+d != o.Replicas {
		return nil, fmt.Errorf("disaggregated %q: want P:D with P and D at least 3 (faults strike two replicas of each side) and P+D the replicas, %d", o.Disaggregated, o.Replicas)
	}
	roles := make([]string, p+d)
	for i := range roles {
		roles[i] = sim.RoleDecode
	}
	left := p
	for i := 0; i < len(roles) && left > 0; i += 2 {
		roles[i], left = sim.RolePrefill, left-1
	}
	for i := len(roles) - 1; left > 0; i-- {
		if roles[i] == sim.RoleDecode {
			roles[i], left = sim.RolePrefill, left-1
		}
	}
	return roles, nil
}

// fault is one injected fault.
type fault struct {
	replica    int
	mode       Mode
	start, end time.Duration
}

// Run performs one chaos run and returns its report, also written to
// o.Out when set. The error reports a run that could not be carried out;
// lost requests and violations are in the report (Report.Pass).
func Run(ctx context.Context, o Options) (rep *Report, err error) {
	o, err = o.withDefaults()
	if err != nil {
		return nil, err
	}
	notef := func(format string, args ...any) {
		if o.Notes != nil {
			_, _ = fmt.Fprintf(o.Notes, format+"\n", args...)
		}
	}
	log := zap.NewNop()
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, err
		}
		l, closeLog, err := fileLogger(filepath.Join(o.Out, FileLog), o.LogLevel)
		if err != nil {
			return nil, err
		}
		log = l
		defer closeLog()
	}

	// Replicas behind their injectors.
	simCfg, err := sim.PresetConfig(sim.DefaultPreset)
	if err != nil {
		return nil, err
	}
	simCfg.TimeScale = o.TimeScale
	t0 := time.Now()
	rec := NewRecorder(t0)
	var (
		reps []*sim.Replica
		injs []*Injector
		urls []string
	)
	defer func() {
		for _, inj := range injs {
			inj.Close()
		}
		for _, r := range reps {
			r.Close()
		}
	}()
	roles, _ := o.roles() // checked by withDefaults
	for i := 0; i < o.Replicas; i++ {
		c := simCfg
		c.Name = replicaName(i)
		if roles != nil {
			c.Role = roles[i]
		}
		r, err := sim.NewReplica(c)
		if err != nil {
			return nil, err
		}
		reps = append(reps, r)
		inj, err := NewInjector(ctx, i, r.Handler(), rec)
		if err != nil {
			return nil, err
		}
		injs = append(injs, inj)
		urls = append(urls, inj.URL())
	}

	// kvroute in process.
	cfg, err := o.kvrouteConfig(urls)
	if err != nil {
		return nil, fmt.Errorf("kvroute config: %w", err)
	}
	srv, err := server.New(cfg, log)
	if err != nil {
		return nil, fmt.Errorf("kvroute: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	kvCtx, stopKV := context.WithCancel(context.Background())
	kvDone := make(chan error, 1)
	go func() { kvDone <- srv.Run(kvCtx, ln, nil) }()
	defer func() {
		stopKV()
		if kerr := <-kvDone; kerr != nil && !errors.Is(kerr, context.Canceled) && err == nil {
			err = fmt.Errorf("kvroute: %w", kerr)
		}
	}()
	if err := waitReady(ctx, srv.Fleet, kvDone); err != nil {
		return nil, err
	}

	// The health monitor, the load and the timeline.
	mon := &monitor{t0: t0}
	monCtx, stopMon := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(monCtx, srv.Fleet) }()
	defer func() { stopMon(); <-monDone }()

	retries0 := retriesTotal(srv)
	d := &driver{
		client:   newClient(),
		endpoint: "http://" + ln.Addr().String() + "/v1/chat/completions",
		model:    simCfg.Model,
		convs:    conversations(o.Users, o.Turns, o.MaxTokens, o.Seed),
		maxTok:   o.MaxTokens,
		share:    o.StreamShare,
		timeout:  o.RequestTimeout,
		t0:       t0,
	}
	defer d.client.CloseIdleConnections()
	var phase atomic.Int32
	stop := make(chan struct{})
	var results []RequestResult
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		results = d.run(ctx, o.Rate, stop, func() int { return int(phase.Load()) })
	}()

	var faults []*fault
	starts := make([]time.Duration, len(PhaseNames)+1)
	var setErr error
	begin := func(replica int, m Mode) {
		f := &fault{replica: replica, mode: m, start: time.Since(t0), end: -1}
		if e := injs[replica].SetMode(m); e != nil && setErr == nil {
			setErr = e
		}
		faults = append(faults, f)
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	interrupted := false
	for i, name := range PhaseNames {
		switch i {
		case 1:
			begin(0, ModeKilled)
		case 2:
			begin(1, ModeHang)
		case 3:
			begin(2, ModeError500)
		case 4:
			begin(3, ModeGarbageMetrics)
		case 5:
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, f := range faults {
				f.end = time.Since(t0)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if e := injs[f.replica].SetMode(ModeNormal); e != nil {
						mu.Lock()
						setErr = errors.Join(setErr, e)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
		}
		starts[i] = time.Since(t0)
		phase.Store(int32(i))
		notef("chaos: %5.1fs  phase %d: %s", starts[i].Seconds(), i, name)
		timer.Reset(o.phaseLen(i))
		select {
		case <-timer.C:
		case <-ctx.Done():
			interrupted = true
		}
		if interrupted {
			break
		}
	}
	end := time.Since(t0)
	starts[len(PhaseNames)] = end
	close(stop)
	notef("chaos: %5.1fs  load stopped; waiting for requests in flight", end.Seconds())
	<-loadDone
	for _, f := range faults { // interrupted before restore
		if f.end < 0 {
			f.end = end
			_ = injs[f.replica].SetMode(ModeNormal)
		}
	}
	stopMon()
	<-monDone
	retries := retriesTotal(srv) - retries0

	rep = analyze(&o, rec, results, mon.transitions(), faults, starts, len(injs))
	rep.RetriesMetric = retries
	rep.Wall = time.Since(t0).Seconds()
	for _, r := range srv.Fleet.Replicas() {
		rep.EjectionsTotal += int(r.Ejections())
	}
	for _, inj := range injs {
		rep.ConnsReset += inj.Resets()
	}
	if o.Out != "" {
		if werr := rep.Write(o.Out); werr != nil {
			return rep, werr
		}
	}
	if setErr != nil {
		return rep, setErr
	}
	if interrupted {
		return rep, ctx.Err()
	}
	return rep, nil
}

// waitReady waits until kvroute's fleet knows every replica's models and
// metrics, as a kvroute up for a while would.
func waitReady(ctx context.Context, fleet *backends.Fleet, kvDone <-chan error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready := true
		for _, r := range fleet.Replicas() {
			if len(r.Models()) == 0 || r.Snapshot() == nil {
				ready = false
			}
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("kvroute: replicas' models and metrics not fetched after 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-kvDone:
			return fmt.Errorf("kvroute stopped: %w", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// retriesTotal sums kvroute_retries_total over replicas.
func retriesTotal(srv *server.Server) float64 {
	mfs, err := srv.Metrics.Registry.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != "kvroute_retries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// Transition is a change of a replica's health in kvroute's fleet.
type Transition struct {
	Replica int     `json:"replica"`
	AtMs    float64 `json:"at_ms"`
	Healthy bool    `json:"healthy"`
	// Cause is the replica's last failure when it was ejected.
	Cause string `json:"cause,omitempty"`
}

// monitor polls the fleet's health every 2 ms and records transitions.
type monitor struct {
	t0    time.Time
	mu    sync.Mutex
	trans []Transition
}

func (m *monitor) run(ctx context.Context, fleet *backends.Fleet) {
	last := map[string]bool{}
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		now := time.Since(m.t0)
		for _, r := range fleet.Replicas() {
			h := r.Healthy()
			prev, seen := last[r.Name()]
			if seen && prev == h || !seen && h {
				last[r.Name()] = h
				continue
			}
			last[r.Name()] = h
			i, err := strconv.Atoi(r.Name()[len("sim-"):])
			if err != nil {
				continue
			}
			m.mu.Lock()
			tr := Transition{Replica: i, AtMs: ms(now), Healthy: h}
			if !h {
				tr.Cause = r.LastError()
			}
			m.trans = append(m.trans, tr)
			m.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (m *monitor) transitions() []Transition {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.trans)
}

// fileLogger returns a JSON zap logger at level writing to path.
func fileLogger(path, level string) (*zap.Logger, func(), error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, nil, err
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(f), lvl))
	return log, func() { _ = log.Sync(); _ = f.Close() }, nil
}
