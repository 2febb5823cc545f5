package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/kvroute/kvroute/bench/chaos"
)

// newBenchChaosCmd is "kvroute bench chaos": the nothing-lost fault run.
func newBenchChaosCmd() *cobra.Command {
	o := chaos.DefaultOptions()
	o.Out = filepath.Join("bench-out", "chaos")
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Inject replica faults under load and check that no request is lost",
		Long: `chaos starts --replicas simulated vLLM replicas, each behind a fault injector,
puts kvroute (in process, cache_aware) in front and drives steady mixed
streaming and non-streaming multi-turn chat load at --rate through it while
faults accumulate along a timeline of --phase-long phases:

  normal → kill sim-0 (listener closed, connections reset) → sim-1 hangs
  (reads requests, never answers) → sim-2 answers every POST with 500 →
  sim-3 serves garbage /metrics → all restored → normal

Every request carries a unique X-Request-Id; the injectors record which
replica saw it and what each sent back. A request succeeds (complete JSON, or
a stream ending with [DONE]), fails with a clear error (an OpenAI error body,
or an SSE error event), or is lost (anything else). It reports the requests
per phase, retries, failures by kind, lost requests, violations of "no
generation sent to a second replica after response bytes reached the
client", and per fault the time kvroute took to eject the replica and to
take it back.

It prints a Markdown table, writes chaos.md, chaos.json and kvroute.log into
--out, and exits non-zero if a request was lost or the invariant broken.`,
		Example: `  kvroute bench chaos --out bench-out/chaos
  kvroute bench chaos --phase 5s --rate 40 --retries 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Notes = cmd.ErrOrStderr()
			ctx, stop := signalContext(cmd)
			defer stop()
			rep, err := chaos.Run(ctx, o)
			if rep == nil {
				return err
			}
			if perr := printReport(cmd.OutOrStdout(), rep.Markdown()); err == nil {
				err = perr
			}
			if o.Out != "" {
				_, _ = fmt.Fprintf(cmd.ErrOrStderr(), "\nwrote %s, %s and %s in %s (%.0fs)\n", chaos.FileMarkdown, chaos.FileJSON, chaos.FileLog, o.Out, rep.Wall)
			}
			if errors.Is(err, context.Canceled) {
				return errors.New("interrupted")
			}
			if err != nil {
				return err
			}
			if !rep.Pass() {
				return fmt.Errorf("chaos: %d requests lost, %d invariant violations", rep.Lost, len(rep.Violations))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Replicas, "replicas", o.Replicas, "simulated replicas (at least 4)")
	f.Float64Var(&o.Rate, "rate", o.Rate, "requests per second, at a fixed interval")
	f.DurationVar(&o.Phase, "phase", o.Phase, "length of each phase")
	f.DurationSliceVar(&o.Phases, "phases", nil, "lengths of the 7 phases, comma-separated (overrides --phase)")
	f.Float64Var(&o.StreamShare, "stream-share", o.StreamShare, "share of streamed requests (0-1)")
	f.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "max_tokens of every request")
	f.IntVar(&o.Users, "users", o.Users, "conversations the requests cycle through")
	f.IntVar(&o.Turns, "turns", o.Turns, "turns per conversation")
	f.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "multiply the replicas' simulated time by this")
	f.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "client deadline per request; a request past it is lost")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the conversations")
	f.IntVar(&o.Retries, "retries", o.Retries, "kvroute retries")
	f.DurationVar(&o.HealthInterval, "health-interval", o.HealthInterval, "kvroute health.interval")
	f.DurationVar(&o.HealthTimeout, "health-timeout", o.HealthTimeout, "kvroute health.timeout")
	f.IntVar(&o.FailThreshold, "fail-threshold", o.FailThreshold, "kvroute health.fail_threshold")
	f.DurationVar(&o.FirstByte, "first-byte", o.FirstByte, "kvroute timeouts.first_byte")
	f.DurationVar(&o.StreamIdle, "stream-idle", o.StreamIdle, "kvroute timeouts.stream_idle")
	f.StringVar(&o.LogLevel, "log-level", o.LogLevel, "kvroute's log level in --out/kvroute.log")
	f.StringVar(&o.Disaggregated, "disaggregated", "", "P:D: split the replicas into P prefill and D decode replicas (both at least 3, P+D = --replicas), prefill on sim-0, sim-2, ... so faults strike both sides")
	f.StringVar(&o.Protocol, "disaggregation-protocol", "vllm", "with --disaggregated: vllm or sglang")
	f.IntVar(&o.LocalPrefillTokens, "local-prefill-tokens", 0, "with --disaggregated and vllm: kvroute's disaggregation.local_prefill_tokens (later turns computed on the decode replica holding the earlier ones; 0: never)")
	f.IntVar(&o.LocalPrefillBacklog, "local-prefill-backlog", 0, "with --disaggregated and vllm: kvroute's disaggregation.local_prefill_backlog (prompts computed on decode replicas while every prefill replica has that many tokens waiting; 0: never)")
	f.StringVar(&o.Out, "out", o.Out, "directory for chaos.md, chaos.json and kvroute.log (empty: none)")
	return cmd
}
