package benchcmd

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/kvroute/kvroute/bench/runner"
)

// replayTo drives the workload o names against any OpenAI-compatible base
// URL, in real time, prints its report and writes the report files into
// o.Out: how a user replays a trace against a real fleet, or against
// another router, with the same load generator.
func replayTo(ctx context.Context, out, errOut io.Writer, url string, o runner.Options) error {
	rep, err := runner.RunURL(ctx, url, o)
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
