package kvtest

import (
	"context"
	"errors"
	"net"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/server"
)

// Main is a TestMain that lets the test binary stand in for `kvroute
// serve`: run as "<binary> arg --config PATH", it serves kvroute with the
// configuration at PATH until SIGTERM or SIGINT instead of running the
// tests. Benchmarks that need a kvroute process start the test binary so.
// Under -race the child carries the race detector too.
func Main(m *testing.M, arg string) {
	if len(os.Args) == 4 && os.Args[1] == arg && os.Args[2] == "--config" {
		if err := serve(os.Args[3]); err != nil {
			_, _ = os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// serve is kvroute serve, minus reloads: the configuration at path, served
// with its admin listener until SIGTERM or SIGINT.
func serve(path string) error {
	cfg, err := config.Load(path, nil)
	if err != nil {
		return err
	}
	lvl, err := zapcore.ParseLevel(cfg.Log.Level)
	if err != nil {
		return err
	}
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.Lock(os.Stderr), lvl))
	srv, err := server.New(cfg, log)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Listen)
	if err != nil {
		return err
	}
	var adminLn net.Listener
	if cfg.AdminListen != "" {
		if adminLn, err = lc.Listen(context.Background(), "tcp", cfg.AdminListen); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := srv.Run(ctx, ln, adminLn); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}
