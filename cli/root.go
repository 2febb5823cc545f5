// Package cli holds kvroute's command line: serve, validate and version.
// Other commands (the benchmarks of bench/cmd) are handed to NewRoot or
// Execute by main.go.
package cli

import (
	"fmt"
	"os"
	"runtime/debug"
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
// format (json|console).
func newLogger(level, format string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log level: %w", err)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("log format %q: want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.EncoderConfig.EncodeTime = rfc3339Millis
	cfg.Sampling = nil
	cfg.DisableStacktrace = true
	cfg.OutputPaths = []string{"stderr"}
	return cfg.Build()
}

// rfc3339Millis writes log times in UTC as RFC 3339 with milliseconds,
// 2006-01-02T15:04:05.000Z, which log shippers parse without configuration.
func rfc3339Millis(t time.Time, enc zapcore.PrimitiveArrayEncoder) {
	millisLayout(t.UTC(), enc)
}

var millisLayout = zapcore.TimeEncoderOfLayout("2006-01-02T15:04:05.000Z07:00")
