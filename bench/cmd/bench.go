package benchcmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/kvroute/kvroute/bench/attack"
	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/overhead"
	"github.com/kvroute/kvroute/bench/runner"
	"github.com/kvroute/kvroute/bench/sim"
)

// Commands returns the benchmarking commands, sim, bench and demo, for the
// root command to add beside serve, validate and version.
func Commands() []*cobra.Command {
	return []*cobra.Command{newSimCmd(), newBenchCmd(), newDemoCmd()}
}

// progressWriter returns w for the progress bar when it is a terminal, and
// nil otherwise: a bar redrawn with carriage returns only clutters a log.
func progressWriter(w io.Writer, disabled bool) io.Writer {
	if f, ok := w.(*os.File); ok && !disabled && term.IsTerminal(int(f.Fd())) {
		return w
	}
	return nil
}

// printReport writes a blank line and then report (a Markdown table) to out.
// Failing to print the result is an error of the command; notes on stderr
// are best effort.
func printReport(out io.Writer, report string) error {
	_, err := fmt.Fprint(out, "\n"+report)
	return err
}

// signalContext is cmd's context, canceled by SIGINT or SIGTERM.
func signalContext(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
}

func newSimCmd() *cobra.Command {
	var (
		replicas, basePort int
		preset, model      string
		timeScale          float64
		kv                 sim.Config // the KVEvents fields
		roleList           []string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated vLLM replicas (no GPU needed)",
		Long: `sim starts N simulated vLLM replicas on 127.0.0.1 ports base-port … base-port+N-1
and serves until interrupted. Each speaks the OpenAI API (/v1/chat/completions,
/v1/completions, /v1/models), /health and vLLM's /metrics, with a paged prefix
cache and a continuous-batching engine whose step times follow the preset's
cost model (multiplied by --time-scale). They also serve vLLM's render
endpoints (/v1/chat/completions/render, /v1/completions/render, /tokenize)
with the replicas' own token ids, and /reset_prefix_cache.

With --kv-events every replica publishes vLLM's KV cache events over ZMQ on
127.0.0.1 (replica i on --kv-events-port+i, its replay socket on
--kv-events-replay-port+i), in --kv-events-encoding; the printed backends
carry the kv_events block for kvroute's config.

With --data-parallel-size D each replica runs D engines behind its one port,
as vLLM does with --data-parallel-size behind one API server: a request goes
to the rank its X-Data-Parallel-Rank header names, else to the least busy,
/metrics labels each rank's series engine="r", and rank r of replica i
publishes its KV events on the ports + i×D + r. The printed backends carry
data_parallel_size.

With --role the replicas play parts of a disaggregated fleet (prefill,
decode or both, one value for all or one per replica): they speak vLLM's
kv_transfer_params and SGLang's bootstrap rooms, a decode receiving a
prompt's KV at the preset's per-token transfer cost instead of computing
it. The printed backends carry role.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := sim.PresetConfig(preset)
			if err != nil {
				return err
			}
			cfg.TimeScale = timeScale
			if model != "" {
				cfg.Model = model
			}
			cfg.KVEvents, cfg.KVEventsEncoding, cfg.KVEventsTopic = kv.KVEvents, kv.KVEventsEncoding, kv.KVEventsTopic
			cfg.KVEventsPort, cfg.KVEventsReplayPort = kv.KVEventsPort, kv.KVEventsReplayPort
			if kv.DataParallelSize < 1 || kv.DataParallelSize > 64 {
				return fmt.Errorf("--data-parallel-size %d is not in 1..64", kv.DataParallelSize)
			}
			cfg.DataParallelSize = kv.DataParallelSize
			roles, err := simRoles(roleList, replicas)
			if err != nil {
				return err
			}
			if roles != nil && kv.DataParallelSize > 1 {
				return errors.New("--role and --data-parallel-size cannot be combined")
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			var fleet *sim.Fleet
			if roles != nil {
				fleet, err = sim.StartRoleFleet(ctx, roles, basePort, cfg)
			} else {
				fleet, err = sim.StartFleet(ctx, replicas, basePort, cfg)
			}
			if err != nil {
				return err
			}
			defer fleet.Close()
			out := cmd.OutOrStdout()
			_, _ = fmt.Fprintf(out, "%d simulated replicas (preset %s, model %s, time scale %g); Ctrl-C to stop.\n", replicas, cfg.Preset, cfg.Model, timeScale)
			if roles != nil {
				_, _ = fmt.Fprintln(out, "disaggregation: {protocol: vllm}  # or sglang: the replicas speak both")
			}
			_, _ = fmt.Fprintln(out, "backends:")
			for i := range replicas {
				// A server's ranks follow one another; its rank 0 names
				// the ports the others' are offset from.
				first := i * kv.DataParallelSize
				_, _ = fmt.Fprintf(out, "  - name: sim-%d\n    url: %s\n", i, fleet.URLs[first])
				if kv.DataParallelSize > 1 {
					_, _ = fmt.Fprintf(out, "    data_parallel_size: %d\n", kv.DataParallelSize)
				}
				if roles != nil {
					_, _ = fmt.Fprintf(out, "    role: %s\n", roles[i])
				}
				if ev := fleet.Replicas[first].KVEventsEndpoints(); ev.Endpoint != "" {
					_, _ = fmt.Fprintf(out, "    kv_events:\n      endpoint: %q\n      replay_endpoint: %q\n      topic: %q\n", ev.Endpoint, ev.ReplayEndpoint, ev.Topic)
				}
			}
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&replicas, "replicas", 4, "number of replicas")
	f.IntVar(&basePort, "base-port", 8001, "port of the first replica (0 picks free ports)")
	f.StringVar(&preset, "preset", sim.DefaultPreset, "cost preset: "+strings.Join(sim.Presets(), ", "))
	f.Float64Var(&timeScale, "time-scale", 1, "multiply all simulated time by this (0.1 runs ten times faster)")
	f.StringVar(&model, "model", "", "served model name (default: the preset's)")
	f.BoolVar(&kv.KVEvents, "kv-events", false, "publish vLLM KV cache events over ZMQ")
	f.StringVar(&kv.KVEventsEncoding, "kv-events-encoding", "positional", "KV event encoding: positional (arrays) or tagged (maps with a type key)")
	f.IntVar(&kv.KVEventsPort, "kv-events-port", 5557, "KV event port of the first replica (0 picks free ports)")
	f.IntVar(&kv.KVEventsReplayPort, "kv-events-replay-port", 5657, "KV event replay port of the first replica (0 picks free ports, -1 serves no replay)")
	f.StringVar(&kv.KVEventsTopic, "kv-events-topic", "", "topic frame of every KV event message")
	f.StringSliceVar(&roleList, "role", nil, "disaggregated roles: prefill, decode or both, one for all replicas or one per replica (comma-separated)")
	f.IntVar(&kv.DataParallelSize, "data-parallel-size", 1, "engines (data-parallel ranks) behind each replica's port, as vLLM --data-parallel-size: a request goes to the rank its X-Data-Parallel-Rank header names, else the least busy; rank r of replica i publishes KV events on the ports + i×size + r")
	return cmd
}

// newFloorRelayCmd is the hidden command that serves bench overhead's
// floor target in a process of its own.
func newFloorRelayCmd() *cobra.Command {
	var listen string
	var upstreams []string
	cmd := &cobra.Command{
		Use:    "floor-relay",
		Short:  "Serve bench overhead's floor target: a bare fasthttp relay",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd)
			defer stop()
			var lc net.ListenConfig
			ln, err := lc.Listen(ctx, "tcp", listen)
			if err != nil {
				return err
			}
			return overhead.ServeFloor(ctx, ln, upstreams)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "address to listen on")
	cmd.Flags().StringSliceVar(&upstreams, "upstreams", nil, "upstream base URLs (http://host:port), comma-separated")
	return cmd
}

// simRoles expands --role to one role per replica (nil without --role).
func simRoles(list []string, replicas int) ([]string, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if len(list) != 1 && len(list) != replicas {
		return nil, fmt.Errorf("--role: %d roles for %d replicas (give one for all, or one each)", len(list), replicas)
	}
	roles := make([]string, replicas)
	for i := range roles {
		r := list[min(i, len(list)-1)]
		switch r {
		case sim.RolePrefill, sim.RoleDecode, "both":
		default:
			return nil, fmt.Errorf("--role: unknown role %q (want prefill, decode or both)", r)
		}
		roles[i] = r
	}
	return roles, nil
}

func newBenchCmd() *cobra.Command {
	o := runner.DefaultOptions()
	var (
		noProgress     bool
		kvrouteProcess bool
		targetURL      string
		trace          string
		azureTrace     string
		// Shared by hotprefix and noreuse.
		requests, maxTokens int
		rate                float64
		seed                uint64
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Compare routers on one workload over simulated replicas",
		Long: `bench replays one workload through several routers, each in front of its own
fresh fleet of simulated replicas (empty caches): kvroute with each policy,
nginx (round-robin) and HAProxy (leastconn; and a consistent hash of
X-Session-ID for workloads with sessions) when they are installed.

It prints a Markdown table and writes results.md, results.json and
results.svg (TTFT CDF, hit rate and TTFT p90 per router) into --out, with
each router's configuration and logs under --out/routers/. Times are
reported in simulated seconds (measured time divided by --time-scale).

With --url the workload is replayed instead against that OpenAI-compatible
base URL (a real fleet, another router, or kvroute in front of a fleet) in
real time: --time-scale is the simulated fleet's and does not apply, every
time is measured, and the same report files are written into --out.

With --precise (or cache_aware+precise in --routers) it also runs kvroute
in precise mode right after kvroute/cache_aware, on its own fresh fleet whose
replicas publish vLLM KV events (tagged encoding, with a replay socket):
kvroute follows every replica's events and asks replica 0 to render each
request (render timeout --precise-render-timeout, 20 ms of real time by
default: a render is real work, not scaled). The other routers' replicas
publish events too, unfollowed, so that every router is served by engines
doing the same work. The report adds, for both,
engine-reported over predicted cached tokens and, for the precise one, the
share of decisions made on exact tokens, renders and fallbacks, the render
p99 and the event streams' gaps, replays and resets. --precise-cut-events
0.3,0.6 cuts every replica's event stream of that fleet once 30 % of the
requests have completed and restores it at 60 %, to count what a cut costs.

With --instances 1,2,4,8 it compares numbers of kvroute instances instead
of routers: the workload runs once per N, on a fresh fleet, through N
kvroute instances (cache_aware, or the one policy --routers names) that
share their decisions through their cluster (an embedded NATS server each),
behind a front that hands each client connection to the next instance in
turn, as a Kubernetes Service does (N=1: one kvroute, no cluster, the
baseline). The table gives, per N, hit rate and TTFT p50/p90 with their
ratio to N=1, errors, the busiest replica's prefill work over the mean,
engine-reported over predicted cached tokens and the instances' messages
and bytes to each other per request.
--kill-instance-at 0.5 stops one instance (not the first) of each run
halfway through its requests, hard, to count what that loses.

Workloads:
  mooncake   the Mooncake FAST'25 conversation trace (--trace, required; --limit, --start-at)
  multiturn  multi-turn sessions sharing a few system prompts (--users, --turns, ...)
  hotprefix  one hot prefix carrying a share of the traffic (--requests, --rate, --hot-share, ...)
  noreuse    unique prompts only (--requests, --rate, --prompt-tokens; --trace: lengths from an Azure LLM trace)
  noisy      a noisy neighbour: tenant "victim" sends short one-shots at a steady rate, tenant
             "aggressor" floods the fleet in the middle of the run (--noisy-*); each request
             names its tenant in X-Tenant. The routers default to kvroute/cache_aware,
             kvroute/cache_aware+flow (flow control on: --flow-*) and nginx, after the victim
             alone through kvroute/cache_aware as the baseline; the report splits every run by
             tenant. Unless --replicas and --time-scale are given it runs on 2 replicas at
             time scale 1: a flood of a larger or sped-up fleet takes more requests per real
             second than one machine sends.
  family:S   shape S of bench family (family:tenants, family:rag, ...), as the family builds it
             (--seed; --trace for family:mooncake and family:azure), e.g. to replay one shape
             with --url

The traces are public and not part of kvroute; download them once:
  Mooncake: ` + load.MooncakeTraceURL + `
  Azure:    ` + load.AzureConvTraceURL + `
            ` + load.AzureCodeTraceURL,
		Example: `  kvroute bench --workload multiturn --routers cache_aware,round_robin,nginx
  kvroute bench --workload mooncake --trace conversation_trace.jsonl --limit 2000 --replicas 8 --time-scale 0.1 --out bench-out/mooncake
  kvroute bench --workload mooncake --trace conversation_trace.jsonl --limit 1000 --routers cache_aware,cache_aware+precise
  kvroute bench --url http://10.0.0.5:8080 --model my-model --workload mooncake --trace conversation_trace.jsonl --limit 500 --out bench-out/fleet
  kvroute bench --instances 1,2,4,8 --workload mooncake --trace conversation_trace.jsonl --limit 3000 --rate-scale 1.6 --out bench-out/instances
  kvroute bench --instances 1,4 --kill-instance-at 0.5 --out bench-out/kill
  kvroute bench --workload noisy --kvroute-process --out bench-out/noisy`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f := cmd.Flags()
			o.HotPrefix.Seed, o.NoReuse.Seed, o.MultiTurn.Seed, o.Noisy.Seed = seed, seed, seed, seed
			if targetURL == "" {
				noisyFleet(&o, f.Changed)
			}
			o.HotPrefix.N, o.NoReuse.N = requests, requests
			o.HotPrefix.Rate, o.NoReuse.Rate = rate, rate
			if f.Changed("max-tokens") {
				o.HotPrefix.MaxTokens, o.NoReuse.MaxTokens = maxTokens, maxTokens
			}
			if err := setTrace(&o, cmp.Or(trace, azureTrace)); err != nil {
				return err
			}
			o.Progress = progressWriter(cmd.ErrOrStderr(), noProgress)
			o.Notes = cmd.ErrOrStderr()
			if err := setKvrouteProcess(&o, kvrouteProcess); err != nil {
				return err
			}
			if targetURL != "" {
				if err := urlFlagsApply(f.Changed); err != nil {
					return err
				}
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			return runBench(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), targetURL, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&targetURL, "url", "", "replay the workload against this OpenAI-compatible base URL (a real fleet or another router), in real time, instead of comparing routers; set --model to its model")
	f.StringVar(&o.Workload, "workload", o.Workload, "workload: "+strings.Join(runner.Workloads, ", ")+", or "+runner.FamilyWorkloadPrefix+"<shape of bench family>")
	f.IntVar(&o.Replicas, "replicas", o.Replicas, "simulated replicas per router")
	disaggregationFlags(f, &o)
	f.StringVar(&o.Preset, "preset", o.Preset, "sim cost preset: "+strings.Join(sim.Presets(), ", "))
	f.StringVar(&o.Model, "model", "", "served model name (default: the preset's; with --url, the endpoint's model, sent in every request)")
	f.StringVar(&o.Bound.RenderURL, "bound-render-url", "", "with --url: a replica of the fleet serving /v1/chat/completions/render (else /tokenize); after the run each request as sent is tokenized there, and the report adds the ideal, the finite-cache and the pooled bound in the engines' tokens (needs --bound-block-tokens, --bound-replicas, --bound-cache-blocks)")
	f.IntVar(&o.Bound.BlockTokens, "bound-block-tokens", 0, "with --bound-render-url: the engines' KV block size, in tokens")
	f.IntVar(&o.Bound.Replicas, "bound-replicas", 0, "with --bound-render-url: the replicas behind --url (each data-parallel rank counted)")
	f.IntVar(&o.Bound.CacheBlocks, "bound-cache-blocks", 0, "with --bound-render-url: each replica's KV cache, in blocks")
	f.StringVar(&o.Bound.AdminURL, "admin-url", "", "with --url in front of kvroute: kvroute's admin base URL; the report adds kvroute's split of the run's prompt tokens (delivered, routing loss, index loss, workload miss)")
	f.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "multiply simulated time and arrivals by this; reports divide by it (simulated fleets only: --url runs in real time)")
	f.Float64Var(&o.RateScale, "rate-scale", o.RateScale, "multiply the arrival rate by this (2 = twice the load)")
	f.IntVar(&o.Limit, "limit", 0, "keep only the first N requests of the workload (0: all)")
	f.DurationVar(&o.TTFTTarget, "ttft-target", o.TTFTTarget, "goodput counts requests with TTFT at most this (simulated time; real time with --url)")
	f.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "per-request timeout (simulated time, at least 10s real; real time with --url)")
	f.StringVar(&o.Out, "out", "bench-out", "directory for results.md, results.json, results.svg and router logs")
	f.StringSliceVar(&o.Routers, "routers", nil, "routers to compare, comma-separated: all (default), "+
		strings.Join(runner.RouterNames(true), ", ")+", "+runner.NamePrecise+", "+runner.NameFlow+" (not in all), or short names cache_aware, cache_aware+precise, cache_aware+flow, session, least_load, round_robin, kvroute, nginx, haproxy, leastconn, hdr_hash; noisy: default cache_aware, cache_aware+flow and nginx")
	f.BoolVar(&o.Precise, "precise", false, preciseFlagUsage)
	f.DurationVar(&o.PreciseRenderTimeout, "precise-render-timeout", 20*time.Millisecond, preciseRenderTimeoutUsage)
	f.Float64SliceVar(&o.PreciseCutEvents, "precise-cut-events", nil, preciseCutEventsUsage)
	f.BoolVar(&kvrouteProcess, "kvroute-process", false, kvrouteProcessUsage)
	f.StringVar(&o.NginxPath, "nginx", "", "nginx binary (default: from PATH or /usr/sbin)")
	f.StringVar(&o.HAProxyPath, "haproxy", "", "haproxy binary (default: from PATH or /usr/sbin)")
	f.IntSliceVar(&o.Instances, "instances", nil, instancesUsage)
	f.DurationVar(&o.LeadTimeout, "lead-timeout", 0, leadTimeoutUsage)
	f.Float64Var(&o.KillInstanceAt, "kill-instance-at", 0, "with --instances: stop one instance (not the first) of each run with several once this fraction (0 to 1) of the requests has been dispatched (0: none)")
	f.DurationVar(&o.StreamFlushInterval, "stream-flush", o.StreamFlushInterval, "sim: minimum real time between two writes of one stream (0: every step)")
	f.BoolVar(&noProgress, "no-progress", false, "do not show the progress bar (shown only on a terminal)")
	f.Uint64Var(&seed, "seed", 1, "seed of the synthetic workloads")

	f.StringVar(&trace, "trace", "", "mooncake: the conversation trace conversation_trace.jsonl (required); noreuse: an Azure LLM inference trace CSV (optional); see the download addresses above")
	f.DurationVar(&o.Mooncake.StartAt, "start-at", 0, "mooncake: skip the trace before this time")
	f.IntVar(&o.Mooncake.MaxTokensCap, "max-tokens-cap", 0, "mooncake: cap each request's output tokens (0: the trace's)")

	mt := &o.MultiTurn
	f.IntVar(&mt.Users, "users", mt.Users, "multiturn: users (sessions)")
	f.IntVar(&mt.Turns, "turns", mt.Turns, "multiturn: turns per session")
	f.IntVar(&mt.SystemPrompts, "system-prompts", mt.SystemPrompts, "multiturn: distinct system prompts shared by the users")
	f.IntVar(&mt.SystemTokens, "system-tokens", mt.SystemTokens, "multiturn: tokens per system prompt")
	f.IntVar(&mt.UserTokens, "user-tokens", mt.UserTokens, "multiturn: tokens per user message")
	f.IntVar(&mt.AnswerTokens, "answer-tokens", mt.AnswerTokens, "multiturn: tokens per answer (max_tokens)")
	f.DurationVar(&mt.Think, "think", mt.Think, "multiturn: think time between an answer and the next turn")
	f.DurationVar(&mt.Duration, "duration", mt.Duration, "multiturn: first turns arrive over this span")

	f.IntVar(&requests, "requests", o.HotPrefix.N, "hotprefix, noreuse: number of requests")
	f.Float64Var(&rate, "rate", o.HotPrefix.Rate, "hotprefix, noreuse: arrival rate in requests per simulated second (Poisson)")
	f.IntVar(&maxTokens, "max-tokens", o.HotPrefix.MaxTokens, "hotprefix, noreuse: max_tokens of every request")
	f.Float64Var(&o.HotPrefix.Share, "hot-share", o.HotPrefix.Share, "hotprefix: share of requests carrying the hot prefix")
	f.IntVar(&o.HotPrefix.PrefixTokens, "prefix-tokens", o.HotPrefix.PrefixTokens, "hotprefix: prefix tokens")
	f.IntVar(&o.HotPrefix.SuffixTokens, "suffix-tokens", o.HotPrefix.SuffixTokens, "hotprefix: unique suffix tokens")
	f.IntVar(&o.NoReuse.PromptTokens, "prompt-tokens", o.NoReuse.PromptTokens, "noreuse: prompt tokens (without --trace)")
	f.StringVar(&azureTrace, "azure-trace", "", "noreuse: the Azure LLM trace CSV (same as --trace)")
	_ = f.MarkDeprecated("azure-trace", "use --trace")
	f.BoolVar(&o.NoReuse.TraceArrivals, "trace-arrivals", false, "noreuse: with --trace, replay its rows in order with their arrival times")

	nz := &o.Noisy
	f.Float64Var(&nz.VictimRate, "noisy-victim-rate", 0, "noisy: the victim's requests per simulated second, for the whole run (0: a tenth of the fleet's capacity, by the simulator's cost model)")
	f.Float64Var(&nz.AggressorRate, "noisy-aggressor-rate", 0, "noisy: the aggressor's requests per simulated second during the flood (0: --noisy-overload × the fleet's capacity)")
	f.Float64Var(&nz.Overload, "noisy-overload", nz.Overload, "noisy: without --noisy-aggressor-rate, the aggressor's rate as a multiple of the fleet's capacity")
	f.DurationVar(&nz.Warmup, "noisy-warmup", nz.Warmup, "noisy: victim-only time before the flood (simulated)")
	f.DurationVar(&nz.Flood, "noisy-flood", nz.Flood, "noisy: how long the aggressor floods (simulated)")
	f.DurationVar(&nz.Cooldown, "noisy-cooldown", nz.Cooldown, "noisy: victim-only time after the flood (simulated)")
	f.IntVar(&nz.PromptTokens, "noisy-prompt-tokens", nz.PromptTokens, "noisy: tokens of each request's unique prompt")
	f.IntVar(&nz.AnswerTokens, "noisy-answer-tokens", nz.AnswerTokens, "noisy: max_tokens of every request")
	fo := &o.Flow
	f.IntVar(&fo.MaxWaiting, "flow-max-waiting", fo.MaxWaiting, "cache_aware+flow: flow.max_waiting, the requests waiting in an engine at which its replica is saturated (0 with --flow-max-running: by the batch alone)")
	f.IntVar(&fo.MaxRunning, "flow-max-running", fo.MaxRunning, "cache_aware+flow: flow.max_running, the requests running and waiting in an engine at which its replica is saturated for a tenant holding its fair share (0: none)")
	f.IntVar(&fo.TenantMaxConcurrent, "flow-tenant-max-concurrent", fo.TenantMaxConcurrent, "cache_aware+flow: flow.tenant_limits.max_concurrent, the requests each tenant may have in flight (0: no limit)")
	f.DurationVar(&fo.MaxWait, "flow-max-wait", fo.MaxWait, "cache_aware+flow: flow.max_wait, the longest a request waits in kvroute's queue before a 503 (simulated time)")
	f.IntVar(&fo.MaxQueued, "flow-max-queued", fo.MaxQueued, "cache_aware+flow: flow.max_queued (0: the workload's requests, at least 1000, with no byte bound, so that only --flow-max-wait refuses)")

	// Subcommands: proxy overhead, fault injection, the workload family, memory floods.
	cmd.AddCommand(newBenchOverheadCmd())
	cmd.AddCommand(newFloorRelayCmd())
	cmd.AddCommand(newBenchChaosCmd())
	cmd.AddCommand(newBenchFamilyCmd())
	cmd.AddCommand(newFloodCmd())
	cmd.AddCommand(attack.NewCommand())
	return cmd
}

func newBenchOverheadCmd() *cobra.Command {
	o := overhead.DefaultOptions()
	o.Out = filepath.Join("bench-out", "overhead")
	var kvrouteBin, baselineBin string
	cmd := &cobra.Command{
		Use:   "overhead",
		Short: "Measure the router's own cost: kvroute and nginx in front of instant upstreams",
		Long: `overhead puts the same fast upstreams (in-process servers that answer at
once, looking like idle vLLM replicas) behind nginx (round-robin, upstream
keepalive, proxy_buffering off), kvroute round_robin and kvroute cache_aware,
and behind nothing (direct, the baseline), and drives each with the same
closed-loop load generator at --concurrency and --low-concurrency
connections for --duration each:

  small      one short user message per request
  multiturn  one conversation per connection growing to --multiturn-bytes
  stream     --stream-events SSE events --stream-gap apart, each stamped with
             its emission time; latency per event is arrival − emission
  manystreams --many-streams streams at once (its only concurrency), events
             --many-streams-gap apart, started spread over
             --many-streams-spread (default one stream's length, so that
             streams end and start at a steady rate)

With --rounds N every comparison runs N times, the targets taking turns
in alternating order, and each target's median round is reported: on a
machine whose speed drifts, every target then sees the same drift.

It reports req/s, latency p50/p99 and the latency each router adds over
direct, with the router's CPU time, and checks the fast-path targets (a
throughput target also needs the capacity ratio, CPU time per request, in
the rounds where both routers saturated their core). Each router runs as
its own process (kvroute as "kvroute serve" with log.level warn, so no
access lines); with --cpus auto the load generator and upstreams are pinned
to the first half of the CPUs and the router to the second.
It prints a Markdown table and writes overhead.md and overhead.json into --out.`,
		Example: `  kvroute bench overhead --rounds 5 --duration 3s --out bench-out/overhead
  kvroute bench overhead --scenarios stream --duration 5s --low-concurrency 0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Notes = cmd.ErrOrStderr()
			if kvrouteBin != "" {
				o.KvrouteCommand = serveCommand(kvrouteBin)
			}
			if baselineBin != "" {
				o.BaselineCommand = serveCommand(baselineBin)
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := overhead.Run(ctx, o)
			if rep == nil {
				return err
			}
			if perr := printReport(cmd.OutOrStdout(), rep.Markdown()); err == nil {
				err = perr
			}
			if o.Out != "" {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "\nwrote %s and %s in %s (%.0fs)\n", overhead.FileMarkdown, overhead.FileJSON, o.Out, rep.Wall)
			}
			if errors.Is(err, context.Canceled) {
				return errors.New("interrupted")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", o.Duration, "measured time per router, scenario and concurrency")
	f.DurationVar(&o.Warmup, "warmup", o.Warmup, "unmeasured load before each measured run")
	f.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of each comparison, targets taking turns; each target's median round is reported")
	f.IntVarP(&o.Concurrency, "concurrency", "c", o.Concurrency, "connections of the closed loop")
	f.IntVar(&o.LowConcurrency, "low-concurrency", o.LowConcurrency, "second, low concurrency for a clean added-latency figure (0: skip)")
	f.IntVar(&o.Upstreams, "upstreams", o.Upstreams, "fast upstreams behind each router")
	f.StringSliceVar(&o.Scenarios, "scenarios", o.Scenarios, "scenarios to run: "+strings.Join(overhead.Scenarios, ", "))
	f.StringSliceVar(&o.Targets, "targets", nil, "targets (default all but floor): direct, floor (a bare fasthttp relay: the least a proxy on fasthttp costs), nginx, round_robin, cache_aware; direct always runs")
	f.IntVar(&o.StreamEvents, "stream-events", o.StreamEvents, "stream: events per response")
	f.DurationVar(&o.StreamGap, "stream-gap", o.StreamGap, "stream: the upstream's pause between events")
	f.IntVar(&o.ManyStreams, "many-streams", o.ManyStreams, "manystreams: concurrent streams")
	f.DurationVar(&o.ManyStreamsGap, "many-streams-gap", o.ManyStreamsGap, "manystreams: the upstream's pause between events")
	f.DurationVar(&o.ManyStreamsSpread, "many-streams-spread", 0, "manystreams: time the first requests are spread over (default one stream's length, events × gap)")
	f.BoolVar(&o.CPUProfile, "cpu-profile", false, "save each kvroute run's CPU profile (pprof, from its admin listener) under --out/routers/")
	f.StringVar(&kvrouteBin, "kvroute", "", `kvroute binary to measure, run as "BINARY serve" (default: this executable)`)
	f.StringVar(&baselineBin, "kvroute-baseline", "", `a second kvroute binary (another build) measured beside --kvroute: each kvroute target gets a baseline/ twin taking turns with it in every round`)
	f.IntVar(&o.MultiTurnBytes, "multiturn-bytes", o.MultiTurnBytes, "multiturn: body size at which a conversation restarts")
	f.StringVar(&o.CPUs, "cpus", o.CPUs, `CPU placement: auto (driver on the first half of the CPUs, routers on the second), none, or DRIVER/ROUTER lists such as 0/1`)
	f.IntVar(&o.DriverProcsPerCPU, "driver-procs-per-cpu", o.DriverProcsPerCPU, "GOMAXPROCS of the load generator and upstreams per CPU they are pinned to")
	f.StringVar(&o.NginxPath, "nginx", "", "nginx binary (default: from PATH or /usr/sbin)")
	f.StringVar(&o.LogLevel, "log-level", o.LogLevel, "kvroute's log.level: info writes an access line per request, and nginx's access log is then on too; warn or error write none, nginx's is off")
	f.StringVar(&o.Out, "out", o.Out, "directory for overhead.md, overhead.json and the routers' configurations and logs")
	return cmd
}

// setTrace gives the trace path to the workload that reads it: the
// Mooncake trace to mooncake, an Azure trace to noreuse. A trace given to a
// workload that reads none is an error rather than silently unused.
func setTrace(o *runner.Options, path string) error {
	switch o.Workload {
	case "mooncake":
		o.Mooncake.TracePath = path
	case "noreuse":
		o.NoReuse.AzurePath = path
	default:
		if path != "" {
			return fmt.Errorf("--trace: the %s workload reads no trace (mooncake and noreuse do)", o.Workload)
		}
	}
	return nil
}

// noisyFleet gives the noisy workload its own fleet defaults
// (runner.NoisyReplicas, runner.NoisyTimeScale) where --replicas and
// --time-scale were not given (changed reports whether a flag was).
func noisyFleet(o *runner.Options, changed func(name string) bool) {
	if o.Workload != "noisy" {
		return
	}
	if !changed("replicas") {
		o.Replicas = runner.NoisyReplicas
	}
	if !changed("time-scale") {
		o.TimeScale = runner.NoisyTimeScale
	}
}

// simOnlyFlags are the bench flags that configure the simulated fleets
// and the routers compared over them, which --url replaces.
var simOnlyFlags = []string{"time-scale", "replicas", "preset", "routers", "precise", "precise-render-timeout", "precise-cut-events", "kvroute-process", "nginx", "haproxy", "stream-flush", "instances", "kill-instance-at", "lead-timeout", "disaggregated", "disaggregation-protocol", "local-prefill-tokens",
	"noisy-overload", "flow-max-waiting", "flow-max-running", "flow-max-wait", "flow-max-queued", "flow-tenant-max-concurrent"}

// preciseRenderTimeoutUsage describes --precise-render-timeout of bench
// and bench family.
const preciseRenderTimeoutUsage = "precise kvroute's precise.render_timeout, in real time (a render is real work, not scaled with --time-scale)"

// kvrouteProcessUsage describes --kvroute-process of bench and bench
// family.
const (
	instancesUsage   = "compare numbers of kvroute instances instead of routers, comma-separated (e.g. 1,2,4,8): N instances sharing through their cluster behind a front spreading connections over them (1: one kvroute, the baseline)"
	leadTimeoutUsage = "with --instances: the instances' cluster.lead_timeout, in real time (0: kvroute's default)"
)

const kvrouteProcessUsage = "run each kvroute as its own process (this executable's serve command), as deployed, instead of in the benchmark's process, where its goroutines share the Go scheduler with the simulated fleet's and the load generator's (not with --instances)"

// setKvrouteProcess sets o's kvroute command for --kvroute-process on:
// this executable's serve command.
func setKvrouteProcess(o *runner.Options, on bool) error {
	if !on {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("--kvroute-process: %w", err)
	}
	o.KvrouteCommand = serveCommand(exe)
	return nil
}

// preciseCutEventsUsage describes --precise-cut-events of bench and bench
// family.
const preciseCutEventsUsage = "CUT,RESTORE: cut every replica's KV event stream of the precise kvroute's fleet once that fraction of the requests has completed, and restore it at the second (e.g. 0.3,0.6), to count what a cut costs"

// preciseFlagUsage describes --precise of bench and bench family.
const preciseFlagUsage = "also run " + runner.NamePrecise + " (kvroute in precise mode: its fleet publishes KV events, which it follows, and replica 0 renders each request's tokens) right after kvroute/cache_aware, which runs too; the same as adding cache_aware+precise to --routers"

// urlFlagsApply rejects, with --url, the flags that only configure the
// simulated fleets: --url runs in real time against the fleet it names.
// changed reports whether the user set a flag.
func urlFlagsApply(changed func(name string) bool) error {
	for _, name := range simOnlyFlags {
		if changed(name) {
			hint := ""
			if name == "time-scale" {
				hint = " (use --rate-scale to change the load)"
			}
			return fmt.Errorf("--%s configures the simulated fleet and does not apply with --url, which replays in real time against the endpoint it names%s", name, hint)
		}
	}
	return nil
}

// runBench runs the benchmark, prints the table to out and says where the
// files went on errOut. A run cut short by a signal still prints what it has.
// With url empty it compares the routers over simulated fleets; otherwise
// it drives the workload o names against that OpenAI-compatible base URL,
// in real time: how a user replays a trace against a real fleet, or against
// another router, with the same load generator.
func runBench(ctx context.Context, out, errOut io.Writer, url string, o runner.Options) error {
	run := runner.Run
	if url != "" {
		run = func(ctx context.Context, o runner.Options) (*runner.Report, error) { return runner.RunURL(ctx, url, o) }
	}
	rep, err := run(ctx, o)
	if rep == nil {
		return err
	}
	if perr := printReport(out, rep.Markdown()); err == nil {
		err = perr
	}
	if o.Out != "" {
		_, _ = fmt.Fprintf(errOut, "\nwrote %s, %s and %s in %s (%.0fs)\n", runner.FileMarkdown, runner.FileJSON, runner.FileSVG, o.Out, rep.Wall)
	}
	if errors.Is(err, context.Canceled) {
		return errors.New("interrupted")
	}
	return err
}

func newDemoCmd() *cobra.Command {
	var (
		out        string
		noProgress bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "See kvroute beat round-robin in about a minute, no GPU needed",
		Long: `demo starts 4 simulated vLLM replicas (sped up fivefold) and replays a short
multi-turn chat workload (40 users, 6 turns each, sharing 4 system prompts)
through kvroute's cache_aware policy, then through round-robin (kvroute's
round_robin policy, and nginx when it is installed), each on a fresh fleet.
It prints the comparison: prefix-cache hit rate, time to first token and
how evenly the work was spread.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := runner.DemoOptions()
			o.Out = out
			o.Progress = progressWriter(cmd.ErrOrStderr(), noProgress)
			errOut := cmd.ErrOrStderr()
			_, _ = fmt.Fprintf(errOut, "kvroute demo: %d users × %d turns on %d simulated replicas, through %s (about 8 s each)\n",
				o.MultiTurn.Users, o.MultiTurn.Turns, o.Replicas, strings.Join(o.Routers, ", "))
			ctx, stop := signalContext(cmd)
			defer stop()
			start := time.Now()
			rep, err := runner.Run(ctx, o)
			if rep == nil {
				return err
			}
			if perr := printReport(cmd.OutOrStdout(), rep.Markdown()+"\n"+demoVerdict(rep)); err == nil {
				err = perr
			}
			_, _ = fmt.Fprintf(errOut, "\ndone in %.0fs", time.Since(start).Seconds())
			if out != "" {
				_, _ = fmt.Fprintf(errOut, "; chart in %s", filepath.Join(out, runner.FileSVG))
			}
			_, _ = fmt.Fprintln(errOut)
			if errors.Is(err, context.Canceled) {
				return errors.New("interrupted")
			}
			return err
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "also write results.md, results.json and results.svg into this directory")
	cmd.Flags().BoolVar(&noProgress, "no-progress", false, "do not show the progress bar (shown only on a terminal)")
	return cmd
}

// demoVerdict sums up cache_aware against round-robin in plain words.
func demoVerdict(rep *runner.Report) string {
	var ca, rr *runner.RouterResult
	for i := range rep.Results {
		switch rep.Results[i].Router {
		case "kvroute/cache_aware":
			ca = &rep.Results[i]
		case "kvroute/round_robin":
			rr = &rep.Results[i]
		}
	}
	if ca == nil || rr == nil || ca.Error != "" || rr.Error != "" || ca.Summary.TTFT.P90 == 0 {
		return ""
	}
	verdict := fmt.Sprintf("cache_aware reused %.0f%% of prompt tokens from cache against %.0f%% for round-robin (ideal %.0f%%)\n"+
		"and computed %.1f× fewer prefill tokens; TTFT p90 %.3fs against %.3fs",
		100*ca.HitRate, 100*rr.HitRate, 100*rep.IdealHitRate,
		float64(rr.PrefillTokens)/float64(max(ca.PrefillTokens, 1)),
		ca.Summary.TTFT.P90, rr.Summary.TTFT.P90)
	if r := rr.Summary.TTFT.P90 / ca.Summary.TTFT.P90; r >= 1.05 {
		verdict += fmt.Sprintf(" (%.1f× lower)", r)
	}
	return verdict + ".\n"
}

// serveCommand is the command line that serves kvroute from the binary
// bin.
func serveCommand(bin string) []string { return []string{bin, "serve"} }

// disaggregationFlags are bench's and bench family's flags of the
// disaggregated fleets.
func disaggregationFlags(f *pflag.FlagSet, o *runner.Options) {
	f.StringSliceVar(&o.Disaggregated, "disaggregated", nil, "also run every kvroute router in front of disaggregated fleets: P:D prefill and decode replicas, P+D = --replicas, comma-separated (e.g. 2:6,4:4)")
	f.StringVar(&o.DisaggregationProtocol, "disaggregation-protocol", "vllm", "the disaggregated fleets' protocol: vllm or sglang")
	f.IntVar(&o.LocalPrefillTokens, "local-prefill-tokens", 0, "vllm split fleets: kvroute's disaggregation.local_prefill_tokens, the most prompt tokens a decode replica holding the rest computes itself, with no prefill leg (0: never)")
	f.IntVar(&o.LocalPrefillMaxRunning, "local-prefill-max-running", 0, "vllm split fleets: kvroute's disaggregation.local_prefill_max_running, with --local-prefill-backlog: a decode replica takes a prompt only while its engine runs fewer requests (0: any number)")
	f.IntVar(&o.LocalPrefillBacklog, "local-prefill-backlog", 0, "vllm split fleets: kvroute's disaggregation.local_prefill_backlog, the prompt tokens every prefill replica must have waiting before a decode replica computes a prompt itself, when it would be done sooner (0: never)")
}
