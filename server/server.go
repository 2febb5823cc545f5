// Package server assembles kvroute from its configuration: the fleet, the
// router, the proxy and the admin listener, and runs them until told to stop.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/radix"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/telemetry"
	"github.com/kvroute/kvroute/tokenize"
)

// Server is one assembled kvroute.
type Server struct {
	cfg     *config.Config
	log     *zap.Logger
	Fleet   *backends.Fleet
	Router  *router.Router
	Proxy   *proxy.Proxy
	Metrics *telemetry.Metrics
	keyer   router.Keyer
}

// Specs converts the configured backends to fleet specs.
func Specs(cfg *config.Config) []backends.Spec {
	specs := make([]backends.Spec, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		specs = append(specs, backends.Spec{Name: b.Name, URL: b.URL, Engine: backends.Engine(b.Engine), Models: b.Models})
	}
	return specs
}

// FleetOptions derives the fleet's options from cfg.
func FleetOptions(cfg *config.Config) backends.Options {
	return backends.Options{
		HealthInterval:     cfg.Health.Interval,
		HealthTimeout:      cfg.Health.Timeout,
		MetricsInterval:    cfg.Metrics.Interval,
		MetricsTimeout:     cfg.Metrics.Timeout,
		FailThreshold:      cfg.Health.FailThreshold,
		ConnectTimeout:     cfg.Timeouts.Connect,
		MaxConnsPerReplica: cfg.Limits.MaxConnsPerReplica,
		Dial:               proxy.Dialer(cfg.Timeouts.Connect, cfg.Timeouts.FirstByte, cfg.Timeouts.StreamIdle),
	}
}

// NewPolicy builds the named routing policy.
func NewPolicy(cfg *config.Config, sessions *router.Sessions) (router.Policy, error) {
	switch cfg.Policy {
	case "round_robin":
		return &router.RoundRobin{}, nil
	case "least_load":
		return router.LeastLoad{}, nil
	case "session":
		return router.NewSessionPolicy(sessions, cfg.CacheAware.Epsilon), nil
	case "cache_aware":
		ca := cfg.CacheAware
		return router.NewCacheAware(router.CacheAwareOptions{
			Lambda: ca.Lambda, Mu: ca.Mu, Epsilon: ca.Epsilon, MinMatchTokens: ca.MinMatchTokens,
			TTL: ca.TTL, BlockSize: ca.BlockSize, DefaultBudget: ca.DefaultBudgetTokens, TreeMaxBytes: ca.TreeMaxBytes,
		}, sessions), nil
	}
	return nil, fmt.Errorf("policy: unknown policy %q", cfg.Policy)
}

// Build assembles a Server from cfg without starting anything; validate runs
// it too, so a configuration that builds here will serve.
func Build(cfg *config.Config, log *zap.Logger) (*Server, error) {
	fleet, err := backends.NewFleet(Specs(cfg), FleetOptions(cfg), log.Named("backends"))
	if err != nil {
		return nil, fmt.Errorf("backends: %w", err)
	}
	sessions := router.NewSessions(cfg.Session.TTL)
	pol, err := NewPolicy(cfg, sessions)
	if err != nil {
		return nil, err
	}
	keyer := router.Keyer{}
	if cfg.Policy == "cache_aware" {
		tok, err := tokenize.New(tokenize.Options{Encoding: cfg.Tokenizer.Encoding, CacheBytes: cfg.Tokenizer.CacheBytes})
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		keyer.Tok = tok
	}
	rt := router.New(fleet, pol)
	metrics := telemetry.New(fleet, func() *radix.Tree {
		if ca, ok := rt.Policy().(*router.CacheAware); ok {
			return ca.Tree()
		}
		return nil
	})
	px := proxy.New(rt, keyer, fleet, metrics, log, proxy.Options{
		MaxBodyBytes:      cfg.Limits.MaxBodyBytes,
		Retries:           cfg.Retries,
		ClientReadTimeout: cfg.Timeouts.ClientHeader,
		SessionHeader:     cfg.Session.Header,
	})
	return &Server{cfg: cfg, log: log, Fleet: fleet, Router: rt, Proxy: px, Metrics: metrics, keyer: keyer}, nil
}

// New is Build under another name, for callers that will Run.
func New(cfg *config.Config, log *zap.Logger) (*Server, error) { return Build(cfg, log) }

// Run serves the proxy on ln and the admin API on adminLn (may be nil) until
// ctx is done, then stops accepting and lets in-flight requests finish for
// up to timeouts.drain.
func (s *Server) Run(ctx context.Context, ln, adminLn net.Listener) error {
	fleetCtx, stopFleet := context.WithCancel(context.Background())
	defer stopFleet()
	s.Fleet.Start(fleetCtx)

	fs := s.Proxy.Server()
	errc := make(chan error, 2)
	go func() { errc <- fs.Serve(ln) }()

	var admin *http.Server
	if adminLn != nil {
		admin = &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("admin listener: %w", err)
			}
		}()
	}
	s.log.Info("kvroute serving", zap.String("listen", ln.Addr().String()), zap.String("policy", s.cfg.Policy),
		zap.Int("backends", len(s.cfg.Backends)))

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.log.Info("shutting down", zap.Duration("drain", s.cfg.Timeouts.Drain))
	dctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeouts.Drain)
	defer cancel()
	if err := fs.ShutdownWithContext(dctx); err != nil {
		s.log.Warn("drain incomplete", zap.Error(err))
	}
	if admin != nil {
		_ = admin.Shutdown(dctx)
	}
	return runErr
}
