// Package server assembles kvroute from its configuration: the fleet, the
// router, the proxy and the admin listener; runs them until told to stop;
// and applies new configurations without dropping requests.
package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/cluster"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/flow"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/proxy"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/sockio"
	"github.com/kvroute/kvroute/telemetry"
	"github.com/kvroute/kvroute/tokenize"
)

// Server is one assembled kvroute.
type Server struct {
	log     *zap.Logger
	Fleet   *backends.Fleet
	Router  *router.Router
	Proxy   *proxy.Proxy
	Metrics *telemetry.Metrics
	tok     *tokenize.Tokenizer
	// Resolver resolves backends with discover: true; net.DefaultResolver
	// unless replaced before Run.
	Resolver backends.Resolver

	mu  sync.Mutex // serializes Reload and discovery rounds
	cfg atomic.Pointer[config.Config]
	// draining is set when shutdown begins; /readyz then answers 503.
	draining atomic.Bool
	// cluster shares routing state with the other instances; nil: off.
	cluster *cluster.Node
	// precise follows the engines' KV events; nil: off.
	precise *preciseMode
}

// Tokenizer returns the routing-key tokenizer.
func (s *Server) Tokenizer() *tokenize.Tokenizer { return s.tok }

// Decide runs the routing path of one request body of kind, as the proxy
// does before forwarding it: Router.Prepare (parse, session, key), Route,
// Release. session stands for the session header's value (nil: none).
// Nothing is forwarded; the decision is recorded as the proxy's would be,
// and the caller calls its Started once the request would have its first
// answer byte.
func (s *Server) Decide(bufs *oai.Buffers, kind oai.Kind, body, session []byte) (router.Decision, error) {
	var req router.Request
	if _, err := s.Router.Prepare(bufs, kind, body, session, &req); err != nil {
		return router.Decision{}, err
	}
	defer s.Router.Release(&req)
	return s.Router.Route(&req, nil)
}

// Index returns the fleet's cache state the policies share.
func (s *Server) Index() *index.Index { return s.Router.Index() }

// Config returns the configuration in force.
func (s *Server) Config() *config.Config { return s.cfg.Load() }

// Specs converts the configured backends to fleet specs (before discovery).
func Specs(cfg *config.Config) []backends.Spec {
	specs := make([]backends.Spec, 0, len(cfg.Backends))
	for _, b := range cfg.Backends {
		specs = append(specs, backends.Spec{
			Name:             b.Name,
			URL:              b.URL,
			Engine:           backends.Engine(b.Engine),
			Models:           b.Models,
			Discover:         b.Discover,
			CacheTokens:      b.CacheTokens,
			Weight:           b.Weight,
			Backup:           b.Backup,
			TLS:              upstreamTLS(cfg.UpstreamTLS.Merge(b.UpstreamTLS)),
			KVEvents:         kvEvents(b.KVEvents),
			DataParallelSize: b.DataParallelSize,
			Role:             backends.Role(b.Role),
			BootstrapPort:    b.BootstrapPort,
		})
	}
	return specs
}

// upstreamTLS converts upstream_tls settings to a replica's TLS settings.
func upstreamTLS(t config.UpstreamTLS) backends.TLS {
	return backends.TLS{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile,
		ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
}

// staticSpecs are the replicas of the specs that need no discovery, one
// per data-parallel rank.
func staticSpecs(specs []backends.Spec) []backends.Spec {
	var out []backends.Spec
	for _, s := range specs {
		if !s.Discover {
			out = append(out, s)
		}
	}
	return backends.ExpandRanks(out)
}

// configurePolicies puts each registered policy's settings in cfg in
// force: the policy in force reads them at its next decision, another
// when it is chosen.
func configurePolicies(cs *router.Configs, cfg *config.Config) error {
	for _, e := range router.Policies() {
		if c := cfg.PolicyConfig(e.Name); c != nil {
			if err := cs.Set(e.Name, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// warnDeprecated logs each deprecated key cfg set.
func warnDeprecated(log *zap.Logger, cfg *config.Config) {
	for _, d := range cfg.Deprecated {
		log.Warn("configuration: " + d)
	}
}

func proxyOptions(cfg *config.Config) proxy.Options {
	return proxy.Options{
		MaxBodyBytes:             cfg.Limits.MaxBodyBytes,
		MaxBodyBufferBytes:       cfg.Limits.MaxBodyBufferBytes,
		Retries:                  cfg.Retries,
		ClientReadTimeout:        cfg.Timeouts.ClientHeader,
		IdleTimeout:              cfg.Timeouts.ClientIdle,
		SessionHeader:            cfg.Session.Header,
		MaxURLBytes:              cfg.Limits.MaxURLBytes,
		MaxHeaderBytes:           cfg.Limits.MaxHeaderBytes,
		MaxConnections:           cfg.Limits.MaxConnections,
		MaxInflight:              cfg.Limits.MaxInflight,
		MaxBufferedResponseBytes: cfg.Limits.MaxBufferedResponseBytes,
		ClientWriteTimeout:       cfg.Timeouts.ClientWrite,
		APIKeys:                  cfg.Auth.APIKeys,
		HideBackendNames:         !cfg.ExposeBackendNames,
		ExposeRouteReason:        cfg.ExposeRouteReason,
		Disaggregation:           disaggregation(cfg),
		LocalPrefill:             localPrefill(&cfg.Disaggregation),
		Flow:                     flowOptions(&cfg.Flow),
		CacheSalt:                saltOptions(&cfg.CacheSalt),
	}
}

// flowOptions are the proxy's flow control options of cfg's flow section.
func flowOptions(f *config.Flow) proxy.FlowOptions {
	l := f.TenantLimits
	return proxy.FlowOptions{
		MaxWaiting:   f.MaxWaiting,
		MaxRunning:   f.MaxRunning,
		LocalityWait: f.LocalityWait,
		MaxKV:        f.MaxKV,
		Queue:        flow.QueueLimits{MaxQueued: f.MaxQueued, MaxQueuedBytes: f.MaxQueuedBytes, MaxWait: f.MaxWait},
		Limits: flow.TenantLimits{Rate: l.Rate, Burst: l.Burst, NoDelay: l.NoDelay, MaxConcurrent: l.MaxConcurrent,
			TokensPerMinute: l.TokensPerMinute, MaxTenants: l.MaxTenants},
		PriorityHeader: f.PriorityHeader,
		Tenant:         tenantSource(f.Tenant),
	}
}

// saltOptions are the proxy's options of cfg's cache_salt section.
func saltOptions(s *config.CacheSalt) proxy.SaltOptions {
	if !s.Enabled() {
		return proxy.SaltOptions{}
	}
	return proxy.SaltOptions{From: tenantSource(s.From), Key: []byte(s.Key)}
}

// tenantSource is the proxy's reading of a tenant source of the config
// (flow.tenant, cache_salt.from).
func tenantSource(src string) proxy.TenantSource {
	if header, ok := config.TenantSourceHeader(src); ok {
		return proxy.TenantSource{Header: header}
	}
	return proxy.TenantSource{APIKey: src == config.TenantAPIKey, User: src == config.TenantUser}
}

// disaggregation is the protocol the proxy pairs prefill and decode
// replicas in: cfg's, when some backend is a prefill or decode replica.
func disaggregation(cfg *config.Config) string {
	for _, b := range cfg.Backends {
		if r := backends.Role(b.Role); r == backends.RolePrefill || r == backends.RoleDecode {
			return cfg.Disaggregation.Protocol
		}
	}
	return ""
}

// Build assembles a Server from cfg without starting anything; validate runs
// it too, so a configuration that builds here will serve. Backends with
// discover: true join when Run first resolves them.
func Build(cfg *config.Config, log *zap.Logger) (*Server, error) {
	fopts := backends.Options{
		HealthInterval:     cfg.Health.Interval,
		HealthTimeout:      cfg.Health.Timeout,
		MetricsInterval:    cfg.Metrics.Interval,
		MetricsTimeout:     cfg.Metrics.Timeout,
		FailThreshold:      cfg.Health.FailThreshold,
		ConnectTimeout:     cfg.Timeouts.Connect,
		MaxConnsPerReplica: cfg.Limits.MaxConnsPerReplica,
		MaxConnWaitTimeout: cfg.Limits.ConnWait,
		FirstByteTimeout:   cfg.Timeouts.FirstByte,
		StreamIdleTimeout:  cfg.Timeouts.StreamIdle,
	}
	specs := Specs(cfg)
	if err := backends.ValidateSpecs(specs); err != nil {
		return nil, err
	}
	fleet, err := backends.NewFleet(staticSpecs(specs), fopts, log.Named("backends"))
	if err != nil {
		return nil, fmt.Errorf("backends: %w", err)
	}
	sessions := router.NewSessions(cfg.Session.TTL)
	sessions.SetLimits(cfg.Session.MaxEntries, cfg.Session.MaxIDBytes)
	tok, err := tokenize.New(tokenize.Options{Encoding: cfg.Tokenizer.Encoding, CacheBytes: cfg.Tokenizer.CacheBytes, KeyBlock: cfg.Index.BlockSize})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	ix := index.New(index.Options{KeyBlock: tok.KeyBlock(), MaxBytes: cfg.Index.TreeMaxBytes,
		DefaultBudget: cfg.Index.DefaultBudgetTokens, TTL: cfg.Index.TTL, BlockSize: cfg.Index.BlockSize})
	deps := router.Deps{Index: ix, Sessions: sessions, Configs: &router.Configs{}}
	if err := configurePolicies(deps.Configs, cfg); err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	warnDeprecated(log, cfg)
	rt, err := router.NewNamed(fleet, cfg.Policy, deps, tok)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	rt.SetResponses(router.NewResponses(cfg.Responses.TTL, cfg.Responses.MaxEntries))
	metrics := telemetry.New(fleet, func() (telemetry.TreeStats, bool) {
		// The tree shows while the policy in force routes on it.
		if _, ok := rt.Policy().(router.IndexUser); ok {
			return ix.Stats(), true
		}
		return telemetry.TreeStats{}, false
	})
	metrics.AddTokenCache(tok.Stats)
	metrics.AddSessions(sessions.Stats)
	metrics.AddIndex(func() telemetry.IndexStats {
		return telemetry.IndexStats{Writes: ix.WritesBySource(), Trims: ix.Trims()}
	})
	px := proxy.New(rt, fleet, metrics, log, proxyOptions(cfg))
	metrics.AddProxy(func() telemetry.ProxyStats {
		return telemetry.ProxyStats{InFlight: px.InFlight(), Conns: px.OpenConns(), BodyBytes: px.BodyBufferBytes()}
	})
	metrics.WatchFlowQueue(px.FlowQueued)
	s := &Server{log: log, Fleet: fleet, Router: rt, Proxy: px, Metrics: metrics,
		tok: tok, Resolver: net.DefaultResolver}
	s.cfg.Store(cfg)
	if err := s.buildPrecise(cfg, ix); err != nil {
		return nil, err
	}
	metrics.AddRoutingStates(s.routingStateMetrics)
	if err := s.buildCluster(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// New is Build under another name, for callers that will Run.
func New(cfg *config.Config, log *zap.Logger) (*Server, error) { return Build(cfg, log) }

// restartOnly names the settings a reload cannot change in place.
func restartOnly(old, cfg *config.Config) []string {
	var keys []string
	if old.Listen != cfg.Listen {
		keys = append(keys, "listen")
	}
	if old.AdminListen != cfg.AdminListen {
		keys = append(keys, "admin_listen")
	}
	if old.TLS != cfg.TLS || old.AdminTLS != cfg.AdminTLS {
		// The certificate files themselves are read again when they change.
		keys = append(keys, "tls/admin_tls")
	}
	if cfg.Limits.MaxBodyBytes > old.Limits.MaxBodyBytes || old.Limits.MaxConnsPerReplica != cfg.Limits.MaxConnsPerReplica || old.Limits.ConnWait != cfg.Limits.ConnWait ||
		old.Limits.MaxHeaderBytes != cfg.Limits.MaxHeaderBytes || old.Limits.MaxConnections != cfg.Limits.MaxConnections {
		keys = append(keys, "limits")
	}
	if old.Health != cfg.Health || old.Metrics != cfg.Metrics || old.Timeouts.Connect != cfg.Timeouts.Connect ||
		old.Timeouts.ClientHeader != cfg.Timeouts.ClientHeader || old.Timeouts.ClientIdle != cfg.Timeouts.ClientIdle {
		keys = append(keys, "health/metrics/timeouts.connect/timeouts.client_header/timeouts.client_idle")
	}
	if old.Tokenizer != cfg.Tokenizer {
		keys = append(keys, "tokenizer")
	}
	if old.Index.TreeMaxBytes != cfg.Index.TreeMaxBytes {
		keys = append(keys, "index.tree_max_bytes")
	}
	if old.Index.BlockSize != cfg.Index.BlockSize {
		// The engines' fallback block size changes now; routing keys keep
		// the tokenizer's blocks.
		keys = append(keys, "index.block_size (as the routing-key block)")
	}
	if old.Log != cfg.Log {
		keys = append(keys, "log")
	}
	if !reflect.DeepEqual(old.Cluster, cfg.Cluster) {
		keys = append(keys, "cluster")
	}
	return keys
}

// Reload applies cfg (already loaded and validated) without dropping
// requests in flight: replicas that stay keep their health, counts and tree
// entries; removed replicas are drained (their requests finish) and their
// tree entries and sessions dropped; added ones start their checks. The
// Index and the session table are kept whatever changes; tuning changes
// apply to the next decision.
// Settings that need a restart are logged and left as they were.
func (s *Server) Reload(ctx context.Context, cfg *config.Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cfg.Load()
	if keys := restartOnly(old, cfg); len(keys) > 0 {
		s.log.Warn("reload: these settings need a restart and keep their old values", zap.Strings("keys", keys))
	}
	specs, err := s.expand(ctx, Specs(cfg))
	if err != nil {
		return err
	}
	if old.Policy != cfg.Policy {
		// The Index, sessions and tuning are the Router's: they stay.
		if err := s.Router.UsePolicy(cfg.Policy); err != nil {
			return fmt.Errorf("policy: %w", err)
		}
	}
	warnDeprecated(s.log, cfg)
	if err := configurePolicies(s.Router.Configs(), cfg); err != nil {
		return fmt.Errorf("policies: %w", err)
	}
	ix := s.Router.Index()
	ix.SetDefaultBudget(cfg.Index.DefaultBudgetTokens)
	ix.SetTTL(cfg.Index.TTL)
	ix.SetBlockSize(cfg.Index.BlockSize)
	sessions := s.Router.Sessions()
	sessions.SetTTL(cfg.Session.TTL)
	sessions.SetLimits(cfg.Session.MaxEntries, cfg.Session.MaxIDBytes)
	s.Router.Responses().SetLimits(cfg.Responses.TTL, cfg.Responses.MaxEntries)
	if _, err := s.updateFleet(specs, true); err != nil {
		return err
	}
	s.Fleet.SetTimeouts(cfg.Timeouts.FirstByte, cfg.Timeouts.StreamIdle)
	opts := proxyOptions(cfg)
	if opts.MaxBodyBytes > old.Limits.MaxBodyBytes {
		opts.MaxBodyBytes = old.Limits.MaxBodyBytes
	}
	s.Proxy.SetOptions(opts)
	s.cfg.Store(cfg)
	s.log.Info("configuration reloaded", zap.Int("replicas", len(s.Fleet.Replicas())), zap.String("policy", cfg.Policy))
	return nil
}

// expand resolves discovered backends. On a resolution error the replicas
// of that backend from the current fleet are kept.
func (s *Server) expand(ctx context.Context, specs []backends.Spec) ([]backends.Spec, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := backends.Expand(rctx, specs, s.Resolver)
	if err == nil {
		return out, nil
	}
	s.log.Warn("discovery: keeping the previous replicas of names that did not resolve", zap.Error(err))
	have := map[string]bool{}
	for _, sp := range out {
		have[sp.Name] = true
	}
	for _, sp := range specs {
		if !sp.Discover {
			continue
		}
		resolved := false
		for _, o := range out {
			if len(o.Name) > len(sp.Name) && o.Name[:len(sp.Name)+1] == sp.Name+"-" {
				resolved = true
				break
			}
		}
		if resolved {
			continue
		}
		for _, r := range s.Fleet.Replicas() {
			n := r.Name()
			if len(n) > len(sp.Name) && n[:len(sp.Name)+1] == sp.Name+"-" && !have[n] {
				out = append(out, r.Spec())
				have[n] = true
			}
		}
	}
	return out, nil
}

// updateFleet swaps the replica list and drops what the policy knew of
// removed replicas. Unless reread is set (a reload, which also picks up
// upstream TLS files rewritten in place), an unchanged list is left alone.
func (s *Server) updateFleet(specs []backends.Spec, reread bool) (changed bool, err error) {
	if !reread && sameSpecs(s.Fleet.Replicas(), specs) {
		return false, nil
	}
	added, removed, err := s.Fleet.Update(specs)
	if err != nil {
		return false, err
	}
	// Events of removed replicas stop before their IDs are forgotten (and
	// may be reused).
	s.syncFollows()
	for _, r := range removed {
		s.Router.Forget(r)
		s.log.Info("replica removed; requests in flight finish", zap.String("replica", r.Name()), zap.Int64("in_flight", r.InFlight()))
	}
	return len(added)+len(removed) > 0, nil
}

func sameSpecs(reps []*backends.Replica, specs []backends.Spec) bool {
	if len(reps) != len(specs) {
		return false
	}
	for i, r := range reps {
		if !reflect.DeepEqual(r.Spec(), specs[i]) {
			return false
		}
	}
	return true
}

// discover re-resolves DNS-named backends every discovery.interval.
func (s *Server) discover(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.cfg.Load().Discovery.Interval):
			s.discoverOnce(ctx)
		}
	}
}

// discoverOnce is one discovery round: backends with discover: true are
// resolved again and the fleet follows. Run makes the first round before the
// fleet starts, so discovered replicas are checked before serving too.
func (s *Server) discoverOnce(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("discovery round panicked", zap.Any("panic", r))
		}
	}()
	if !slices.ContainsFunc(s.cfg.Load().Backends, func(b config.Backend) bool { return b.Discover }) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	specs, err := s.expand(ctx, Specs(s.cfg.Load()))
	if err != nil {
		s.log.Warn("discovery", zap.Error(err))
		return
	}
	if changed, err := s.updateFleet(specs, false); err != nil {
		s.log.Warn("discovery: fleet update rejected", zap.Error(err))
	} else if changed {
		s.log.Info("discovery: replica list changed", zap.Int("replicas", len(specs)))
	}
}

// Run serves the proxy on ln and the admin API on adminLn (may be nil),
// over TLS when tls (admin_tls) has a certificate, until ctx is done; then it
// drains (drain.go): /readyz answers 503 at once, new connections are
// accepted for timeouts.drain_delay, requests in flight get timeouts.drain
// and streams still open after that are cut. Run closes both listeners.
func (s *Server) Run(ctx context.Context, ln, adminLn net.Listener) error {
	cfg := s.cfg.Load()
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()
	closeAll := func() {
		_ = ln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
	}
	defer closeAll()
	var adminBound string
	if adminLn != nil {
		adminBound = adminLn.Addr().String()
	}
	var err error
	// Below TLS, so that its records are read and written the cheaper way.
	ln = sockio.Listener(ln)
	if ln, err = s.serveTLS(bg, "tls", cfg.TLS, ln); err != nil {
		return err
	}
	// After TLS: a connection over limits.max_connections is answered over it.
	ln = s.Proxy.LimitListener(ln)
	if adminLn != nil {
		if adminLn, err = s.serveTLS(bg, "admin_tls", cfg.AdminTLS, adminLn); err != nil {
			return err
		}
	}
	s.discoverOnce(bg)
	s.Fleet.Start(bg)
	go s.discover(bg)
	s.startPrecise(bg)
	go s.watchRoutingStates(bg)
	if err := s.startCluster(bg); err != nil {
		return err
	}
	defer s.stopCluster()
	defer stopBG() // before stopCluster: the member stops with bg

	go s.Proxy.ServeFlow(bg)
	go s.watchPeers(bg)
	go func() {
		if err := s.Proxy.ServeStreams(bg); err != nil {
			s.log.Info("streams are relayed one goroutine each", zap.Error(err))
		}
	}()
	fs := s.Proxy.Server()
	errc := make(chan error, 2)
	go func() { errc <- fs.Serve(ln) }()

	var admin *http.Server
	if adminLn != nil {
		admin = &http.Server{Handler: s.AdminHandler(adminBound), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: adminErrorLog(s.log)}
		go func() {
			if err := admin.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("admin listener: %w", err)
			}
		}()
		if adminExposed(adminBound, cfg.Auth.AdminToken) {
			s.log.Warn("the admin listener is not on a loopback address and auth.admin_token is empty: "+
				"/debug/* and pprof answer 403 except to loopback clients; only /healthz, /readyz and /metrics are served to others",
				zap.String("admin_listen", adminBound))
		}
	}
	s.log.Info("kvroute serving", zap.String("listen", ln.Addr().String()), zap.Bool("tls", cfg.TLS.Enabled()),
		zap.String("admin_listen", adminBound), zap.String("policy", cfg.Policy), zap.Int("backends", len(cfg.Backends)), s.clusterLog())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	// A listener that failed skips the delay: nothing is accepted anyway.
	s.drain(fs, runErr == nil)
	if admin != nil {
		actx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = admin.Shutdown(actx)
	}
	return runErr
}

// localPrefill is the proxy's router.LocalPrefill of d.
func localPrefill(d *config.Disaggregation) router.LocalPrefill {
	return router.LocalPrefill{Tokens: d.LocalPrefillTokens, Backlog: d.LocalPrefillBacklog, MaxRunning: d.LocalPrefillMaxRunning}
}
