// Package cli holds kvroute's command line: serve, validate and version.
// Other commands (the benchmarks of bench/cmd) are handed to NewRoot or
// Execute by main.go.
package cli

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Version is set at build time with -ldflags "-X github.com/kvroute/kvroute/cli.Version=v1.2.3".
var Version = "dev"

// NewRoot builds the kvroute command tree: serve, validate, version and
// the commands in more.
func NewRoot(more ...*cobra.Command) *cobra.Command {
	root := &cobra.Command{
		Use:   "kvroute",
		Short: "KV-cache-aware load balancer for vLLM and SGLang fleets",
		Long: `kvroute sits in front of a fleet of vLLM or SGLang replicas, speaks the
OpenAI API, and sends each request to the replica most likely to hold its
prompt prefix in KV cache, weighed against queue depth, KV memory pressure
and health.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServeCmd(), newValidateCmd(), newVersionCmd())
	root.AddCommand(more...)
	return root
}

// Execute runs the command line built by NewRoot(more...) and exits
// non-zero on error.
func Execute(more ...*cobra.Command) {
	if err := NewRoot(more...).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvroute:", err)
		os.Exit(1)
	}
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := Version
			if bi, ok := debug.ReadBuildInfo(); ok && v == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				v = bi.Main.Version
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "kvroute %s\n", v)
			return err
		},
	}
}

// newLogger builds the zap logger for level (debug|info|warn|error) and
// format (json|console), writing to stderr. With flush above 0 the lines
// are buffered (lineBuffer) and written out at least every flush until
// ctx is done; the caller Syncs the logger before it exits.
func newLogger(ctx context.Context, level, format string, flush time.Duration) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	var cfg zap.Config
	var enc func(zapcore.EncoderConfig) zapcore.Encoder
	switch format {
	case "json":
		cfg, enc = zap.NewProductionConfig(), zapcore.NewJSONEncoder
	case "console":
		cfg, enc = zap.NewDevelopmentConfig(), zapcore.NewConsoleEncoder
	default:
		return nil, fmt.Errorf("log format %q: want json or console", format)
	}
	cfg.EncoderConfig.EncodeTime = rfc3339Millis
	stderr := zapcore.Lock(os.Stderr)
	var core zapcore.Core
	if flush > 0 {
		buf := newLineBuffer(os.Stderr)
		core = &flushCore{Core: zapcore.NewCore(enc(cfg.EncoderConfig), buf, lvl), buf: buf}
		go buf.run(ctx, flush)
	} else {
		core = zapcore.NewCore(enc(cfg.EncoderConfig), stderr, lvl)
	}
	opts := []zap.Option{zap.ErrorOutput(stderr), zap.AddCaller()}
	if cfg.Development {
		opts = append(opts, zap.Development())
	}
	return zap.New(core, opts...), nil
}

// rfc3339Millis writes log times in UTC as RFC 3339 with milliseconds,
// 2006-01-02T15:04:05.000Z, which log shippers parse without configuration.
// Every access line has one: the text of the last millisecond a line was
// written in is kept (logStamp), so that under load a time is formatted
// once a millisecond rather than once a line.
func rfc3339Millis(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	t = t.UTC()
	ms := t.UnixMilli()
	s := logStamp.Load()
	if s == nil || s.ms != ms {
		s = &stamp{ms: ms, text: t.Format(millisLayout)}
		logStamp.Store(s)
	}
	enc.AppendString(s.text)
}

const millisLayout = "2006-01-02T15:04:05.000Z07:00"

// stamp is a log time's text, for rfc3339Millis.
type stamp struct {
	ms   int64 // Unix milliseconds
	text string
}

var logStamp atomic.Pointer[stamp]
