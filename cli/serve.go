package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
)

// addConfigFlags registers --config and the flags that override config keys.
func addConfigFlags(fs *pflag.FlagSet) {
	fs.StringP("config", "c", "config.yaml", "path of the YAML configuration file")
	fs.String("listen", "", "proxy listener address (overrides listen)")
	fs.String("admin-listen", "", "admin listener address (overrides admin_listen)")
	fs.String("policy", "", "routing policy: "+strings.Join(router.Names(), ", ")+" (overrides policy)")
	fs.String("log-level", "", "debug, info, warn or error (overrides log.level)")
	fs.String("log-format", "", "json or console (overrides log.format)")
}

// loadConfig reads the configuration named by --config, with environment
// and flag overrides. Only flags the user set override the file.
func loadConfig(cmd *cobra.Command) (*config.Config, error) {
	path, _ := cmd.Flags().GetString("config")
	set := pflag.NewFlagSet("set", pflag.ContinueOnError)
	cmd.Flags().Visit(func(f *pflag.Flag) { set.AddFlag(f) })
	return config.Load(path, set)
}

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the proxy in front of the configured replicas",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			logCtx, stopLog := context.WithCancel(cmd.Context())
			defer stopLog()
			log, err := newLogger(logCtx, cfg.Log.Level, cfg.Log.Format, cfg.Log.FlushInterval)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			path, _ := cmd.Flags().GetString("config")
			return serve(ctx, cfg, log, path, func() (*config.Config, error) { return loadConfig(cmd) })
		},
	}
	addConfigFlags(cmd.Flags())
	return cmd
}

// serve runs kvroute until ctx is done (SIGTERM or SIGINT), then drains:
// /readyz answers 503 at once, new connections are accepted for
// timeouts.drain_delay, requests in flight get timeouts.drain. It reloads
// the configuration on SIGHUP and when the file at path changes; the TLS
// certificates, when their files change.
func serve(ctx context.Context, cfg *config.Config, log *zap.Logger, path string, load func() (*config.Config, error)) error {
	srv, err := server.New(cfg, log)
	if err != nil {
		return err
	}
	if err := server.CheckTLS(cfg); err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		// Draining has begun: a second SIGINT or SIGTERM takes its default
		// action and ends the process at once.
		signal.Reset(syscall.SIGINT, syscall.SIGTERM)
	}()
	// Watching starts before the listeners open, so that a change made
	// once kvroute answers is never missed.
	watch := watchConfig(path, log.Named("reload"))
	go watch.run(ctx, func(reason string) {
		next, err := load()
		if err == nil {
			err = srv.Reload(ctx, next)
		}
		srv.Metrics.Reload(err == nil)
		if err != nil {
			log.Error("configuration rejected; the previous one keeps serving", zap.String("trigger", reason), zap.Error(err))
		}
	})
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	var adminLn net.Listener
	if cfg.AdminListen != "" {
		if adminLn, err = lc.Listen(ctx, "tcp", cfg.AdminListen); err != nil {
			_ = ln.Close()
			return fmt.Errorf("admin_listen %s: %w", cfg.AdminListen, err)
		}
	}
	err = srv.Run(ctx, ln, adminLn)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func newValidateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "validate",
		Short: "Check a configuration file and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(cmd)
			if err != nil {
				return err
			}
			if _, err := server.Build(cfg, zap.NewNop()); err != nil {
				return err
			}
			if err := server.CheckTLS(cfg); err != nil {
				return err
			}
			for _, d := range cfg.Deprecated {
				_, _ = fmt.Fprintln(cmd.ErrOrStderr(), "warning:", d)
			}
			path, _ := cmd.Flags().GetString("config")
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s: ok (%d backends, policy %s)\n", path, len(cfg.Backends), cfg.Policy)
			return err
		},
	}
	addConfigFlags(cmd.Flags())
	return cmd
}

// configWatch is what a reload follows: SIGHUP, and the configuration
// file's directory (editors and Kubernetes ConfigMaps swap the file, so the
// directory is watched).
type configWatch struct {
	hup    chan os.Signal
	w      *fsnotify.Watcher // nil when the file is not watched
	events <-chan fsnotify.Event
	errs   <-chan error
	base   string
	log    *zap.Logger
}

// watchConfig starts following SIGHUP and the file at path ("" for none);
// run then acts on what it sees. Without a watch on the file (logged),
// SIGHUP still reloads.
func watchConfig(path string, log *zap.Logger) *configWatch {
	c := &configWatch{hup: make(chan os.Signal, 1), base: filepath.Base(path), log: log}
	signal.Notify(c.hup, syscall.SIGHUP)
	if path == "" {
		return c
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(filepath.Dir(path)); err != nil {
			_ = w.Close()
		}
	}
	if err != nil {
		log.Warn("cannot watch the configuration file; SIGHUP still reloads", zap.Error(err))
		return c
	}
	c.w, c.events, c.errs = w, w.Events, w.Errors
	return c
}

// run calls reload on SIGHUP and when the file is written, created or
// replaced, until ctx is done; then it stops watching. Bursts of events
// within 200ms reload once. An error of the watch (the kernel's queue of
// events overflowed, say) is logged and reloads too, since a change may
// have been lost with it; the watch's errors must be read, or it stops
// delivering events.
func (c *configWatch) run(ctx context.Context, reload func(reason string)) {
	defer signal.Stop(c.hup)
	if c.w != nil {
		defer func() { _ = c.w.Close() }()
	}
	events, errs := c.events, c.errs
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.hup:
			reload("SIGHUP")
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			// A Kubernetes ConfigMap volume swaps its "..data" symlink.
			if n := filepath.Base(ev.Name); n == c.base || n == "..data" {
				debounce = time.After(200 * time.Millisecond)
			}
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			c.log.Warn("configuration file watch: reloading in case a change was lost", zap.Error(err))
			debounce = time.After(200 * time.Millisecond)
		case <-debounce:
			debounce = nil
			reload("file changed")
		}
	}
}
