package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/runner"
)

// replayTo drives the workload o names against any OpenAI-compatible base
// URL and prints its summary: how a user replays a trace against a real
// fleet, or against another router, with the same load generator.
func replayTo(ctx context.Context, w io.Writer, url string, o runner.Options) error {
	wl, err := runner.BuildWorkload(o)
	if err != nil {
		return err
	}
	res, err := load.Run(ctx, strings.TrimRight(url, "/"), wl, load.RunOptions{Model: o.Model, Timeout: o.RequestTimeout})
	if err != nil {
		return err
	}
	ts := o.TimeScale
	if ts <= 0 {
		ts = 1
	}
	sum := res.Summarize(o.TTFTTarget, ts)
	if _, err := fmt.Fprintf(w, "%s against %s: %d/%d ok, TTFT p50 %.3fs p90 %.3fs p99 %.3fs, goodput %.2f/s (TTFT <= %v), reported hit rate %.1f %%\n",
		wl.Name, url, sum.OK, sum.Requests, sum.TTFT.P50, sum.TTFT.P90, sum.TTFT.P99, sum.Goodput, o.TTFTTarget, 100*sum.ReportedHitRate); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(sum, "", "  ")
	_, err = fmt.Fprintln(w, string(b))
	return err
}
