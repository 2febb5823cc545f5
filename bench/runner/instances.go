package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bench/child"
	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/cluster"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

const (
	// maxInstances bounds Options.Instances: each instance is a kvroute
	// and an embedded NATS server in this process.
	maxInstances = 32
	// minClusterBatchInterval and minClusterLoadInterval floor the scaled
	// cluster.batch_interval and cluster.load_interval: shorter batches
	// would cost the shared CPU more than they save, and a peer silent for
	// three load intervals counts as gone, which a busy machine must not
	// cause by scheduling delays alone.
	minClusterBatchInterval = 250 * time.Microsecond
	minClusterLoadInterval  = 50 * time.Millisecond
	// peersTimeout bounds the wait for every instance to see all others.
	peersTimeout = 20 * time.Second
	// killPoll is how often the kill watcher counts dispatched requests.
	killPoll = 2 * time.Millisecond
)

// Instances runs N kvroute instances in-process, each in front of the whole
// fleet, behind one front (an L4 balancer on 127.0.0.1) that hands each
// new client connection to the next instance in turn, as a Kubernetes
// Service spreads connections over router pods. With N > 1 the instances
// share their decisions through their cluster: each embeds a NATS server
// with its routes on 127.0.0.1, the first one's route address their seed;
// Start returns once every instance hears from all the others. With N = 1
// it is one kvroute without cluster behind the same front: the baseline.
type Instances struct {
	// Kvroute is each instance's policy and settings; the cluster's batch
	// and load intervals are scaled by its TimeScale too (no lower than
	// 250 µs and 50 ms).
	Kvroute
	// N is the number of instances, at least 1.
	N int
	// KillAt, in (0, 1) with N > 1, stops the last instance once the
	// instances together have dispatched that fraction of Requests: its
	// Run is canceled and the front resets the connections relayed to it,
	// as when a pod dies. The front then finds it gone at its next dial.
	// 0 stops none.
	KillAt float64
	// Requests is the number of requests of the workload, for KillAt.
	Requests int
	// LeadTimeout is cluster.lead_timeout, in real time; 0: the default.
	LeadTimeout time.Duration

	// last is the group of the last successful Start, read for the report
	// once the run is over.
	last *instanceGroup
}

var _ Router = (*Instances)(nil)

// Name implements Router: "kvroute/<policy>×N".
func (in *Instances) Name() string { return in.Kvroute.Name() + "×" + strconv.Itoa(in.N) }

// instanceID names instance i in the cluster and its files.
func instanceID(i int) string { return "kv-" + strconv.Itoa(i) }

// Start implements Router: it starts the N instances (instance i keeping
// its configuration and log in dir/kv-i), waits until each sees the N-1
// others, and starts the front whose URL the instance has.
func (in *Instances) Start(ctx context.Context, backends []string, dir string) (Instance, error) {
	if in.N < 1 {
		return nil, fmt.Errorf("instances: N must be at least 1, got %d", in.N)
	}
	g := &instanceGroup{stopc: make(chan struct{}), killed: -1, timeScale: in.TimeScale}
	fail := func(err error) (Instance, error) {
		_ = g.Stop()
		return nil, err
	}
	for i := range in.N {
		id := instanceID(i)
		sub := filepath.Join(dir, id)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return fail(err)
		}
		cfg, err := in.Config(backends, sub)
		if err != nil {
			return fail(fmt.Errorf("%s config: %w", id, err))
		}
		if in.N > 1 {
			seed := ""
			if i > 0 {
				if seed, err = g.seed(ctx); err != nil {
					return fail(err)
				}
			}
			if err := in.cluster(cfg, id, seed, filepath.Join(sub, "kvroute.yaml")); err != nil {
				return fail(fmt.Errorf("%s cluster config: %w", id, err))
			}
		}
		inst, err := in.serve(ctx, cfg, sub)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", id, err))
		}
		g.insts = append(g.insts, inst)
	}
	if err := g.waitPeers(ctx); err != nil {
		return fail(err)
	}
	targets := make([]string, len(g.insts))
	for i, inst := range g.insts {
		targets[i] = strings.TrimPrefix(inst.url, "http://")
	}
	f, err := startFront(ctx, targets)
	if err != nil {
		return fail(err)
	}
	g.front, g.url, g.started = f, "http://"+f.Addr(), time.Now()
	if in.KillAt > 0 && in.N > 1 {
		threshold := uint64(math.Ceil(in.KillAt * float64(in.Requests)))
		g.wg.Add(1)
		go g.killAfter(max(threshold, 1), in.N-1)
	}
	in.last = g
	return g, nil
}

// cluster sets cfg's cluster section for instance id, joining the cluster
// through seed (a route address; empty for the first instance), and
// appends it to the configuration file at path (Kvroute.Config's, kept
// with the results).
func (in *Instances) cluster(cfg *config.Config, id, seed, path string) error {
	scale := in.TimeScale
	if scale <= 0 {
		scale = 1
	}
	c := &cfg.Cluster
	c.Enabled, c.Name, c.ID, c.Listen = true, "bench", id, "127.0.0.1:0"
	c.Peers = nil
	if seed != "" {
		c.Peers = []string{seed}
	}
	// The environment may not point the benchmark's cluster elsewhere.
	c.Discover, c.NATSURL, c.Token, c.TLS = "", "", benchClusterToken, config.ClusterTLS{}
	c.BatchInterval = max(time.Duration(float64(c.BatchInterval)*scale), minClusterBatchInterval)
	c.LoadInterval = max(time.Duration(float64(c.LoadInterval)*scale), minClusterLoadInterval)
	if in.LeadTimeout > 0 {
		c.LeadTimeout = in.LeadTimeout
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "cluster:\n  enabled: true\n  name: %q\n  id: %q\n  listen: %q\n  token: %q\n  peers: [%s]\n  batch_interval: %q\n  load_interval: %q\n  lead_timeout: %q\n",
		c.Name, c.ID, c.Listen, c.Token, strings.Join(quoteAll(c.Peers), ", "), c.BatchInterval.String(), c.LoadInterval.String(), c.LeadTimeout.String())
	return errors.Join(err, f.Close())
}

// benchClusterToken is the benchmark's route token, drawn for the run.
var benchClusterToken = func() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// quoteAll returns each of ss quoted.
func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return q
}

// instanceGroup is the running instances of one Instances and their front.
type instanceGroup struct {
	insts     []*kvrouteInstance
	front     *front
	url       string
	started   time.Time
	timeScale float64

	stopc chan struct{} // closed by Stop: the kill watcher ends
	wg    sync.WaitGroup
	once  sync.Once
	err   error

	mu     sync.Mutex
	killed int // index of the killed instance, -1 while none
	kill   *InstanceKill
	// handedAtKill is the connections the front had handed the killed
	// instance when it reset them.
	handedAtKill int
	// traffic is each instance's cluster traffic, read at Stop (the killed
	// one's at its kill); handed is the front's connections per instance.
	traffic []ClusterTraffic
	handed  []int
}

func (g *instanceGroup) URL() string { return g.url }

// CachedTokens implements cacheReporter: the sums over the instances.
func (g *instanceGroup) CachedTokens() (predicted, reported int64) {
	for _, inst := range g.insts {
		p, r := inst.CachedTokens()
		predicted += p
		reported += r
	}
	return predicted, reported
}

// ReuseTokens implements reuseReporter: the sums over the instances.
func (g *instanceGroup) ReuseTokens() map[string]int64 {
	out := map[string]int64{}
	for _, inst := range g.insts {
		for kind, n := range inst.ReuseTokens() {
			out[kind] += n
		}
	}
	return out
}

// seed returns the first instance's route address, the others' peer,
// once it is bound.
func (g *instanceGroup) seed(ctx context.Context) (string, error) {
	var addr string
	err := child.WaitReady(ctx, peersTimeout, g.insts[0].done, func() error {
		if addr = g.insts[0].srv.ClusterAddr(); addr == "" {
			return errors.New("no route address yet")
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%s: %w", instanceID(0), err)
	}
	return addr, nil
}

// waitPeers waits until every instance hears from all the others.
func (g *instanceGroup) waitPeers(ctx context.Context) error {
	n := len(g.insts)
	if n < 2 {
		return nil
	}
	err := child.WaitReady(ctx, peersTimeout, nil, func() error {
		var short []string
		for i, inst := range g.insts {
			if st := inst.srv.ClusterStats(); st.Peers < n-1 {
				short = append(short, fmt.Sprintf("%s hears from %d", instanceID(i), st.Peers))
			}
		}
		if len(short) > 0 {
			return fmt.Errorf("want %d peers each: %s", n-1, strings.Join(short, ", "))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("cluster of %d instances: %w", n, err)
	}
	return nil
}

// dispatched is the number of requests the instances have dispatched to
// replicas (retries included).
func (g *instanceGroup) dispatched() uint64 {
	var n uint64
	for _, inst := range g.insts {
		for _, r := range inst.srv.Fleet.Replicas() {
			n += r.Dispatched()
		}
	}
	return n
}

// killAfter kills instance victim once the instances have dispatched
// threshold requests, unless the group stops first.
func (g *instanceGroup) killAfter(threshold uint64, victim int) {
	defer g.wg.Done()
	tick := time.NewTicker(killPoll)
	defer tick.Stop()
	for {
		select {
		case <-g.stopc:
			return
		case <-tick.C:
		}
		if n := g.dispatched(); n >= threshold {
			g.killNow(victim, n)
			return
		}
	}
}

// killNow stops instance i hard: its Run is canceled and the front resets
// the connections it relays to it, so that the requests in flight on it
// fail and clients open new connections, which the front hands to the
// others once its dial of i fails.
func (g *instanceGroup) killNow(i int, dispatched uint64) {
	inst := g.insts[i]
	inFlight := inst.srv.Proxy.InFlight()
	traffic := trafficOf(inst.srv)
	at := time.Since(g.started)
	inst.cancel()
	open, handed := g.front.cut(i)
	g.mu.Lock()
	g.killed, g.handedAtKill = i, handed
	g.kill = &InstanceKill{Instance: instanceID(i), Dispatched: dispatched, InFlight: inFlight, Connections: open,
		At: at.Seconds() / g.scale()}
	g.traffic = make([]ClusterTraffic, len(g.insts))
	g.traffic[i] = traffic
	g.mu.Unlock()
	_ = inst.Stop()
}

func (g *instanceGroup) scale() float64 {
	if g.timeScale <= 0 {
		return 1
	}
	return g.timeScale
}

// Stop implements Instance: it reads every instance's cluster traffic and
// the front's counts, closes the front and stops the instances.
func (g *instanceGroup) Stop() error {
	g.once.Do(func() {
		close(g.stopc)
		g.wg.Wait()
		g.mu.Lock()
		if g.traffic == nil {
			g.traffic = make([]ClusterTraffic, len(g.insts))
		}
		for i, inst := range g.insts {
			if i != g.killed {
				g.traffic[i] = trafficOf(inst.srv)
			}
		}
		g.mu.Unlock()
		if g.front != nil {
			g.handed = g.front.Handed()
			g.front.Close()
			if g.kill != nil {
				// Handed to it after the reset, before a dial failed.
				g.kill.Connections += g.handed[g.killed] - g.handedAtKill
			}
		}
		var errs []error
		for i, inst := range g.insts {
			if err := inst.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", instanceID(i), err))
			}
		}
		g.err = errors.Join(errs...)
	})
	return g.err
}

// trafficOf reads s's cluster counters (zero without cluster).
func trafficOf(s *server.Server) ClusterTraffic {
	st := s.ClusterStats()
	return ClusterTraffic{SentMessages: st.SentMessages, SentBytes: st.SentBytes, ReceivedMessages: st.ReceivedMessages,
		ReceivedBytes: st.ReceivedBytes, Records: st.Records, Gaps: st.Gaps, Resyncs: st.Resyncs, Lag: s.ClusterLag(),
		LeadWait: s.ClusterLeadWait(), LeadAsked: st.LeadAsked, LeadMissed: st.LeadMissed, LeadServed: st.LeadServed, LeadLapsed: st.LeadLapsed}
}

// ClusterTraffic is what kvroute instances exchanged through their cluster.
type ClusterTraffic struct {
	// SentMessages and SentBytes are the messages (batches and resync
	// chunks) the instances published and their bytes.
	SentMessages uint64 `json:"sent_messages"`
	SentBytes    uint64 `json:"sent_bytes"`
	// ReceivedMessages and ReceivedBytes are those they received from
	// their peers.
	ReceivedMessages uint64 `json:"received_messages"`
	ReceivedBytes    uint64 `json:"received_bytes"`
	// Records is the records (placements, lifecycle, load, sessions,
	// response ids) published in live batches.
	Records uint64 `json:"records"`
	// Gaps is the live batches whose sequence showed missed messages;
	// Resyncs the resyncs asked of peers.
	Gaps    uint64 `json:"gaps"`
	Resyncs uint64 `json:"resyncs"`
	// Lag is how long peers' placements took to reach each instance's
	// index, in real time (buckets of cluster.LagBounds).
	Lag cluster.Lag `json:"placement_lag"`
	// LeadAsked is the requests placed on load whose replica an instance
	// asked the cluster's leader for, LeadMissed those not answered in
	// time (chosen alone), LeadServed the asks the leader answered and
	// LeadLapsed its reservations no placement released.
	LeadAsked  uint64 `json:"lead_asked"`
	LeadMissed uint64 `json:"lead_missed"`
	LeadServed uint64 `json:"lead_served"`
	LeadLapsed uint64 `json:"lead_lapsed"`
	// LeadWait is how long the instances waited for the leader's answers,
	// real time (buckets of cluster.LagBounds).
	LeadWait cluster.Lag `json:"lead_wait"`
}

func (t *ClusterTraffic) add(o ClusterTraffic) {
	t.SentMessages += o.SentMessages
	t.SentBytes += o.SentBytes
	t.ReceivedMessages += o.ReceivedMessages
	t.ReceivedBytes += o.ReceivedBytes
	t.Records += o.Records
	t.Gaps += o.Gaps
	t.Lag.Add(o.Lag)
	t.Resyncs += o.Resyncs
	t.LeadAsked += o.LeadAsked
	t.LeadMissed += o.LeadMissed
	t.LeadServed += o.LeadServed
	t.LeadLapsed += o.LeadLapsed
	t.LeadWait.Add(o.LeadWait)
}

// InstanceKill records the instance Instances.KillAt stopped.
type InstanceKill struct {
	// Instance is its id (kv-<i>).
	Instance string `json:"instance"`
	// Dispatched is how many requests the instances had dispatched then.
	Dispatched uint64 `json:"dispatched"`
	// InFlight is the requests it had received and not answered yet
	// (kvroute_in_flight_requests).
	InFlight int64 `json:"in_flight"`
	// Connections is the client connections the kill ended: those the
	// front relayed to it then, and any it handed to it after, before its
	// dial failed. A connection carries one request at a time, so at most
	// that many requests can have been lost: those in flight, and those
	// sent at that instant on a kept-alive connection.
	Connections int `json:"connections"`
	// At is when, in simulated seconds from the start of the load.
	At float64 `json:"at_s"`
}

// InstancesRun is the comparison of Options.Instances: one row per number
// of instances, in the order run.
type InstancesRun struct {
	// Policy is the instances' routing policy.
	Policy string `json:"policy"`
	// KillAt is Options.KillInstanceAt.
	KillAt float64        `json:"kill_at,omitempty"`
	Rows   []InstancesRow `json:"rows"`
}

// InstancesRow is one run of N instances.
type InstancesRow struct {
	Instances int    `json:"instances"`
	Router    string `json:"router"`
	// Error is the run's failure, if any.
	Error string `json:"error,omitempty"`
	// Requests, OK and Errors count the workload's requests.
	Requests int `json:"requests"`
	OK       int `json:"ok"`
	Errors   int `json:"errors"`
	// HitRate is the replicas' own hit rate; TTFTP50 and TTFTP90 are in
	// simulated seconds.
	HitRate float64 `json:"replica_hit_rate"`
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	// PrefillImbalance is the busiest replica's prefill tokens over the
	// mean: how evenly the instances together spread the work.
	PrefillImbalance float64 `json:"prefill_max_mean"`
	// HitRateVsOne and TTFTP90VsOne are HitRate and TTFTP90 over those of
	// the run with one instance; 0 when there was none.
	HitRateVsOne float64 `json:"hit_rate_vs_one,omitempty"`
	TTFTP90VsOne float64 `json:"ttft_p90_vs_one,omitempty"`
	// PredictedCached and EngineCached are the instances' predicted cached
	// tokens and the engines' reports, summed; Precision is the second
	// over the first.
	PredictedCached int64   `json:"predicted_cached_tokens"`
	EngineCached    int64   `json:"engine_cached_tokens"`
	Precision       float64 `json:"precision"`
	// Traffic is the instances' cluster traffic, summed; MessagesPerRequest
	// and BytesPerRequest are its sent messages and bytes over Requests.
	Traffic            ClusterTraffic `json:"traffic"`
	MessagesPerRequest float64        `json:"messages_per_request"`
	BytesPerRequest    float64        `json:"bytes_per_request"`
	// Connections is how many client connections the front handed each
	// instance.
	Connections []int `json:"connections"`
	// Kill is the instance stopped during the run, if any.
	Kill *InstanceKill `json:"kill,omitempty"`
}

// checkInstances checks Options.Instances and KillInstanceAt.
func (o *Options) checkInstances() error {
	var errs []error
	seen := map[int]bool{}
	for _, n := range o.Instances {
		if n < 1 || n > maxInstances {
			errs = append(errs, fmt.Errorf("instances: %d is not from 1 to %d", n, maxInstances))
		}
		if seen[n] {
			errs = append(errs, fmt.Errorf("instances: %d is listed twice", n))
		}
		seen[n] = true
	}
	if o.Precise && len(o.Instances) > 0 {
		errs = append(errs, errors.New("precise: not with instances (instances run approximate kvroutes only)"))
	}
	if o.KvrouteCommand != nil && len(o.Instances) > 0 {
		errs = append(errs, errors.New("kvroute process: not with instances (instances run in the benchmark's process)"))
	}
	if o.KillInstanceAt != 0 {
		if len(o.Instances) == 0 {
			errs = append(errs, errors.New("kill instance at: only with instances"))
		}
		if !(o.KillInstanceAt > 0 && o.KillInstanceAt < 1) {
			errs = append(errs, fmt.Errorf("kill instance at must be between 0 and 1 (a fraction of the run), got %v", o.KillInstanceAt))
		}
	}
	return errors.Join(errs...)
}

// instancesPolicy is the policy o.Routers names for Options.Instances:
// cache_aware when it names none.
func instancesPolicy(o *Options, hasSessions bool) (string, error) {
	if len(o.Routers) == 0 {
		return router.CacheAwareName, nil
	}
	routers, _, err := ResolveRouters(o.Routers, hasSessions, o.NginxPath, o.HAProxyPath)
	if err == nil && len(routers) == 1 {
		if k, ok := routers[0].(*Kvroute); ok && !k.Precise {
			return k.Policy, nil
		}
	}
	return "", fmt.Errorf("instances: routers must name one kvroute policy (cache_aware, session, least_load or round_robin), got %s",
		strings.Join(o.Routers, ","))
}

// runInstances is Run for Options.Instances: the workload w once per
// number of instances, each run on a fresh fleet, into one report whose
// Instances holds the comparison.
func runInstances(ctx context.Context, o Options, simCfg sim.Config, w *load.Workload, kind string) (*Report, error) {
	policy, err := instancesPolicy(&o, w.HasSessions)
	if err != nil {
		return nil, err
	}
	rep := newReport(&o, simCfg, w, kind)
	rep.Instances = &InstancesRun{Policy: policy, KillAt: o.KillInstanceAt}
	var notes []string
	routers := make([]Router, len(o.Instances))
	for i, n := range o.Instances {
		routers[i] = &Instances{Kvroute: Kvroute{Policy: policy}, N: n, KillAt: o.KillInstanceAt, Requests: len(w.Requests), LeadTimeout: o.LeadTimeout}
		if n == 1 && o.KillInstanceAt > 0 {
			notes = append(notes, fmt.Sprintf("%s: nothing killed (the first instance is never stopped)", routers[i].Name()))
		}
	}
	return runRouters(ctx, rep, o, simCfg, w, routers, notes, func(r Router, res *RouterResult) {
		rep.Instances.add(r.(*Instances), res, len(w.Requests))
	})
}

// add records the run of in, whose result is res, and updates every
// row's ratios to the run with one instance.
func (ir *InstancesRun) add(in *Instances, res *RouterResult, requests int) {
	s := &res.Summary
	row := InstancesRow{
		Instances: in.N, Router: res.Router, Error: res.Error, Requests: s.Requests, OK: s.OK, Errors: s.Errors,
		HitRate: res.HitRate, TTFTP50: s.TTFT.P50, TTFTP90: s.TTFT.P90, PrefillImbalance: res.PrefillImbalance,
		PredictedCached: res.PredictedCached, EngineCached: res.EngineCached, Precision: res.Precision,
	}
	if g := in.last; g != nil {
		in.last = nil
		for _, t := range g.traffic {
			row.Traffic.add(t)
		}
		row.Connections, row.Kill = g.handed, g.kill
	}
	if requests > 0 {
		row.MessagesPerRequest = float64(row.Traffic.SentMessages) / float64(requests)
		row.BytesPerRequest = float64(row.Traffic.SentBytes) / float64(requests)
	}
	ir.Rows = append(ir.Rows, row)
	var one *InstancesRow
	for i := range ir.Rows {
		if ir.Rows[i].Instances == 1 && ir.Rows[i].Error == "" {
			one = &ir.Rows[i]
		}
	}
	if one == nil {
		return
	}
	for i := range ir.Rows {
		r := &ir.Rows[i]
		if one.HitRate > 0 {
			r.HitRateVsOne = r.HitRate / one.HitRate
		}
		if one.TTFTP90 > 0 {
			r.TTFTP90VsOne = r.TTFTP90 / one.TTFTP90
		}
	}
}

// instancesMarkdown renders an Options.Instances report: the setup, one
// row per number of instances, the instance killed in each run, and the
// notes.
func (r *Report) instancesMarkdown() string {
	ir := r.Instances
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## kvroute bench: %s through 1 to N kvroute instances\n\n", r.Workload)
	w("%d requests (%s prompt tokens) on %d × %s replicas (model %s, block %d tokens), a fresh fleet per run, time scale %g, rate scale %g; %s.\n\n",
		r.Requests, count(r.PromptTokens), r.Replicas, r.Preset, r.Model, r.BlockSize, r.TimeScale, r.RateScale, r.Host)
	w("Each run puts N kvroute instances (policy %s) in front of the fleet, behind an L4 front that hands each new client connection to the next instance in turn, as a Kubernetes Service does: a kept-alive connection stays on one instance, so the turns of a conversation reach several. ", ir.Policy)
	w("With more than one, the instances share their decisions through their cluster (an embedded NATS server each, routes over 127.0.0.1). ")
	w("Ideal prefix-cache hit rate (one server, infinite cache): **%s**", pct(r.IdealHitRate))
	if r.Oracle != nil {
		w("; finite-cache bound: **%s**", pct(r.Oracle.Bound.HitRate))
	}
	w(". Times are simulated (unscaled) seconds. *vs one* is the ratio to the run with one instance; *prefill max/mean* compares the busiest replica's prefill tokens with the average; *cached* is the engines' reported cached tokens over the instances' predictions; *messages* and *bytes per request* are what the instances published to each other (batches and resync chunks, summed over instances) over the workload's requests; *placement lag* is the time from an instance's placement to a peer applying it to its index, real time, at most the bucket bound given; *leader asks / missed* counts the requests placed on load (cold, or a new branch of a shared prefix) whose replica an instance asked the cluster's leader for, and those it chose alone past cluster.lead_timeout, and the wait for an answer (real time); *connections* counts the front's client connections per instance.\n\n")
	w("| instances | ok | errors | hit rate | vs one | TTFT p50 | TTFT p90 | vs one | prefill max/mean | cached | messages/request | bytes/request | placement lag p50 / p99 | gaps / resyncs | leader asks / missed | wait p50 / p99 | connections |\n")
	w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n")
	for i := range ir.Rows {
		row := &ir.Rows[i]
		if row.Error != "" && row.Requests == 0 {
			w("| %d | – | – | – | – | – | – | – | – | – | – | – | – | – | – | – | – |\n", row.Instances)
			continue
		}
		res := r.result(row.Router)
		errs := fmt.Sprint(row.Errors)
		if res != nil {
			errs = errorCell(&res.Summary)
		}
		w("| %d | %d/%d | %s | %s | %s | %s | %s | %s | %.2f | %s | %.1f | %s | %s | %d / %d | %d / %d | %s | %s |\n",
			row.Instances, row.OK, row.Requests, errs, pct(row.HitRate), vsOne(row.HitRateVsOne),
			secs(row.TTFTP50), secs(row.TTFTP90), vsOne(row.TTFTP90VsOne), row.PrefillImbalance, fractionCell(row.Precision, row.PredictedCached != 0),
			row.MessagesPerRequest, bytesCell(row.BytesPerRequest), lagCell(row.Traffic.Lag), row.Traffic.Gaps, row.Traffic.Resyncs, row.Traffic.LeadAsked, row.Traffic.LeadMissed, lagCell(row.Traffic.LeadWait), joinInts(row.Connections, " / "))
	}
	var kills []string
	for i := range ir.Rows {
		row := &ir.Rows[i]
		if k := row.Kill; k != nil {
			kills = append(kills, fmt.Sprintf("with %d, %s was stopped at %s (%d requests dispatched) with %d requests in flight, its %d client connections reset; the run had %d errors",
				row.Instances, k.Instance, secs(k.At), k.Dispatched, k.InFlight, k.Connections, row.Errors))
		}
	}
	if len(kills) > 0 {
		w("\nKilled at %s of the requests (its Run canceled, its connections reset; a connection carries one request at a time, so the errors are at most the connections reset): %s.\n", pct(ir.KillAt), strings.Join(kills, "; "))
	}
	writeNotes(&b, r.Notes)
	return b.String()
}

// joinInts writes ns in decimal, sep between them.
func joinInts(ns []int, sep string) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, sep)
}

// result returns the result of the router named name, nil if none.
func (r *Report) result(name string) *RouterResult {
	for i := range r.Results {
		if r.Results[i].Router == name {
			return &r.Results[i]
		}
	}
	return nil
}

// vsOne renders a ratio to the one-instance run, "–" without one.
func vsOne(f float64) string {
	if f == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", f)
}

// bytesCell renders a byte count per request.
func bytesCell(f float64) string {
	if f >= 10_000 {
		return fmt.Sprintf("%.1f KiB", f/1024)
	}
	return fmt.Sprintf("%.0f B", f)
}

// kvrouteOf returns the kvroute settings of r: r itself, those of each
// instance of an Instances, or those of a noisy run's baseline; nil for
// the other routers.
func kvrouteOf(r Router) *Kvroute {
	switch r := r.(type) {
	case *Kvroute:
		return r
	case *Instances:
		return &r.Kvroute
	case *noisyAlone:
		return r.Kvroute
	}
	return nil
}

// lagCell renders a placement lag's p50 and p99 as bucket bounds ("≤ 1ms
// / ≤ 5ms"); – without placements heard from peers.
func lagCell(l cluster.Lag) string {
	if l.Count == 0 {
		return "–"
	}
	q := func(p float64) string {
		d, ok := l.Quantile(p)
		if !ok {
			return "> " + cluster.LagBounds[len(cluster.LagBounds)-1].String()
		}
		return "≤ " + d.String()
	}
	return q(0.5) + " / " + q(0.99)
}
