package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/bench/runner"
	"github.com/kvroute/kvroute/bench/sim"
)

// newBenchFamilyCmd is "kvroute bench family": every shape of the workload
// family through the routers, in one table.
func newBenchFamilyCmd() *cobra.Command {
	f := runner.FamilyOptions{Options: runner.DefaultOptions(), Seed: 1, Scale: 1}
	f.Out = filepath.Join("bench-out", "family")
	var (
		noProgress     bool
		kvrouteProcess bool
		traces         []string
	)
	cmd := &cobra.Command{
		Use:   "family",
		Short: "Run every workload shape through the routers and tabulate hits against the oracle",
		Long: `family runs each shape of the workload family through the routers as bench
runs one workload (a fresh fleet of simulated replicas per router):

  tenants     tenants with long system prompts, growing multi-turn sessions
  agentic     coding sessions whose context grows from ~12k to ~80k tokens over 30 turns, 5 s think time
  fewshot     one-shots sharing a few long few-shot prefixes
  rag         a system prompt, one of a set of shared documents, a unique question
  hotprefix   one hot prefix carrying half the traffic
  noreuse     unique prompts only (synthetic)
  sequential  one user at a time: 12 conversations sharing a system prompt, one request in flight
  bursts      bursts of requests at the same instant over a few shared prefixes
  mooncake    the Mooncake conversation trace (--trace FILE.jsonl; skipped without it)
  azure       prompt and output lengths of an Azure LLM trace (--trace FILE.csv; skipped without it)

Each shape has a few hundred requests (--scale multiplies them). It writes
one table, rows shape × router, with each router's hit tokens as a fraction
of the finite-cache bound (b) and of the ideal (a), TTFT p50/p90, prefill
max/mean and errors, into --out as family.md and family.json, and each
shape's full bench report into --out/<shape>/. With --precise (or
cache_aware+precise in --routers) kvroute in precise mode runs too, right
after cache_aware, and a second table gives each shape's precision of both
beside precise mode's decisions, renders, fallbacks and event gaps.

With --heavy each shape runs at its heavy point instead, a load at which
nginx round-robin's TTFT p90 passed 5 s here: its own size, rate scale and
time scale, shown in the table (--scale, --rate-scale and --time-scale are
then refused). sequential has none (one request is ever in flight) and runs
at its default load.

With --disaggregated 4:4 every kvroute router also runs, on each shape, in
front of a fleet of 4 prefill and 4 decode replicas (rows "pd=4:4"; their
of (b) is against the bound of the prefill replicas), as bench
--disaggregated does; the table then gives TPOT p90 too.

With --instances 1,2 each shape runs instead through N kvroute instances
sharing their cluster (one policy: cache_aware, or the one --routers
names), as bench --instances runs one workload: the table's rows are then
shape × number of instances, and each shape's report is the instances
comparison.`,
		Example: `  kvroute bench family --out bench-out/family
  kvroute bench family --scale 0.2 --replicas 4 --routers cache_aware,round_robin
  kvroute bench family --trace conversation_trace.jsonl --trace AzureLLMInferenceTrace_conv.csv --rate-scale 2
  kvroute bench family --precise --routers cache_aware --shapes tenants,agentic,rag --scale 0.5
  kvroute bench family --heavy --routers cache_aware,least_load,nginx --trace conversation_trace.jsonl
  kvroute bench family --heavy --instances 1,2 --shapes tenants,agentic
  kvroute bench family --heavy --routers cache_aware,round_robin --disaggregated 4:4 --trace conversation_trace.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, t := range traces {
				switch {
				case strings.HasSuffix(t, ".jsonl"):
					f.MooncakeTrace = t
				case strings.HasSuffix(t, ".csv"):
					f.AzureTrace = t
				default:
					return fmt.Errorf("--trace %s: want the Mooncake trace (.jsonl) or an Azure trace (.csv)", t)
				}
			}
			f.Progress = progressWriter(cmd.ErrOrStderr(), noProgress)
			f.Notes = cmd.ErrOrStderr()
			if err := setKvrouteProcess(&f.Options, kvrouteProcess); err != nil {
				return err
			}
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := runner.RunFamily(ctx, f)
			if rep == nil {
				return err
			}
			if perr := printReport(cmd.OutOrStdout(), rep.Markdown()); err == nil {
				err = perr
			}
			if f.Out != "" {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "\nwrote %s and %s in %s (%.0fs)\n", runner.FileFamilyMarkdown, runner.FileFamilyJSON, f.Out, rep.Wall)
			}
			if errors.Is(err, context.Canceled) {
				return errors.New("interrupted")
			}
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Out, "out", f.Out, "directory for family.md, family.json and each shape's report")
	fl.Uint64Var(&f.Seed, "seed", f.Seed, "seed of the synthetic shapes")
	fl.BoolVar(&f.Heavy, "heavy", false, "run each shape at its heavy point (its own size, rate scale and time scale, in the table) instead of at light load")
	fl.Float64Var(&f.Scale, "scale", f.Scale, "multiply each shape's size (sessions, requests, bursts; below 1 also turns, at least 3)")
	fl.StringSliceVar(&f.Shapes, "shapes", nil, "shapes to run, comma-separated (default all): "+strings.Join(runner.Shapes, ", "))
	fl.StringSliceVar(&traces, "trace", nil, "a trace for the mooncake (.jsonl) or azure (.csv) shape; repeat for both")
	fl.IntVar(&f.Replicas, "replicas", f.Replicas, "simulated replicas per router")
	fl.StringVar(&f.Preset, "preset", f.Preset, "sim cost preset: "+strings.Join(sim.Presets(), ", "))
	fl.StringVar(&f.Model, "model", "", "served model name (default: the preset's)")
	fl.Float64Var(&f.TimeScale, "time-scale", f.TimeScale, "multiply simulated time and arrivals by this; reports divide by it")
	fl.Float64Var(&f.RateScale, "rate-scale", f.RateScale, "multiply every shape's arrival rate by this (2 = twice the load)")
	fl.StringSliceVar(&f.Routers, "routers", nil, "routers to compare, comma-separated (default "+strings.Join(runner.DefaultFamilyRouters, ",")+", and nginx when installed); the names of bench --routers")
	fl.BoolVar(&f.Precise, "precise", false, preciseFlagUsage)
	fl.DurationVar(&f.PreciseRenderTimeout, "precise-render-timeout", 20*time.Millisecond, preciseRenderTimeoutUsage)
	fl.Float64SliceVar(&f.PreciseCutEvents, "precise-cut-events", nil, preciseCutEventsUsage)
	fl.BoolVar(&kvrouteProcess, "kvroute-process", false, kvrouteProcessUsage)
	fl.IntSliceVar(&f.Instances, "instances", nil, instancesUsage)
	fl.DurationVar(&f.LeadTimeout, "lead-timeout", 0, leadTimeoutUsage)
	fl.DurationVar(&f.TTFTTarget, "ttft-target", f.TTFTTarget, "goodput counts requests with TTFT at most this (simulated time)")
	fl.DurationVar(&f.RequestTimeout, "request-timeout", f.RequestTimeout, "per-request timeout (simulated time, at least 10s real)")
	fl.StringVar(&f.NginxPath, "nginx", "", "nginx binary (default: from PATH or /usr/sbin)")
	fl.StringVar(&f.HAProxyPath, "haproxy", "", "haproxy binary (default: from PATH or /usr/sbin)")
	fl.DurationVar(&f.StreamFlushInterval, "stream-flush", f.StreamFlushInterval, "sim: minimum real time between two writes of one stream (0: every step)")
	disaggregationFlags(fl, &f.Options)
	fl.BoolVar(&noProgress, "no-progress", false, "do not show the progress bar (shown only on a terminal)")
	return cmd
}
