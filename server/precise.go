package server

import (
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/precise"
	"github.com/kvroute/kvroute/telemetry"
	"github.com/kvroute/kvroute/tokenize"
)

// preciseMode is precise mode's parts: the renderer of exact tokens, the
// followers of the engines' KV events, and what each replica is followed
// at.
type preciseMode struct {
	render *precise.Renderer
	events *precise.Events
	log    *zap.Logger
	// maxSilence is precise.max_event_silence (routing_state.go).
	maxSilence time.Duration

	mu      sync.Mutex
	ctx     context.Context // Run's; nil before it
	follows map[*backends.Replica]precise.Endpoint
}

// kvEvents converts a backend's kv_events to its spec's.
func kvEvents(k *config.KVEvents) backends.KVEvents {
	if k == nil {
		return backends.KVEvents{}
	}
	ev := backends.KVEvents{Endpoint: k.Endpoint, ReplayEndpoint: k.ReplayEndpoint, Topic: k.Topic}
	if k.Listen != "" {
		ev.Endpoint, ev.Bind = k.Listen, true
		allow := make([]string, 0, len(k.AllowFrom))
		for _, a := range k.AllowFrom {
			if p, err := config.ParsePeerPrefix(a); err == nil { // checked by config.Load
				allow = append(allow, p.String())
			}
		}
		ev.AllowFrom = strings.Join(allow, ",")
	}
	return ev
}

// buildPrecise sets precise mode up when precise.render_url is set.
func (s *Server) buildPrecise(cfg *config.Config, ix *index.Index) error {
	if !cfg.Precise.Enabled() {
		return nil
	}
	log := s.log.Named("precise")
	r, err := precise.NewRenderer(precise.RenderOptions{URL: cfg.Precise.RenderURL, Timeout: cfg.Precise.RenderTimeout,
		CacheBytes: cfg.Precise.RenderCacheBytes, PrefixAfter: prefixAfter(cfg.Precise.PrefixTurns), Log: log})
	if err != nil {
		return err
	}
	ev, err := precise.NewEvents(precise.EventsOptions{Index: ix, Log: log, MaxSilence: cfg.Precise.MaxEventSilence,
		MaxEventBytes: cfg.Precise.MaxEventBytes,
		OnLive:        func(rep *backends.Replica, live bool) { ix.EngineWriter().SetPrecise(rep, live) }})
	if err != nil {
		r.Close()
		return err
	}
	s.precise = &preciseMode{render: r, events: ev, log: log, follows: map[*backends.Replica]precise.Endpoint{},
		maxSilence: cfg.Precise.MaxEventSilence}
	s.Router.SetExact(exactKeys{r: r, block: ix.KeyBlock()})
	s.Metrics.AddPrecise(func() telemetry.PreciseStats { return s.preciseStats(ix) })
	return nil
}

// prefixAfter is precise.prefix_turns as RenderOptions.PrefixAfter, whose
// zero means its default and a negative value never.
func prefixAfter(turns int) int {
	if turns == 0 {
		return -1
	}
	return turns
}

// preciseStats reads precise mode's counters for /metrics.
func (s *Server) preciseStats(ix *index.Index) telemetry.PreciseStats {
	rs := s.precise.render.Stats()
	st := telemetry.PreciseStats{
		Renders: map[string]uint64{"rendered": rs.Rendered, "tokenized": rs.Tokenized, "cache_hit": rs.CacheHits, "pass_through": rs.PassThrough,
			"prefix": rs.Prefix, "late": rs.Late, "background_failed": rs.VerifyFailed, "background_skipped": rs.Unverified},
		Fallbacks: map[string]uint64{"timeout": rs.FallbackTimeout, "not_served": rs.FallbackNotServed,
			"unkeyed": rs.FallbackUnkeyed, "behind": rs.FallbackBehind, "error": rs.FallbackError},
		RenderP99: rs.Latency.P99.Seconds(),
	}
	now := time.Now()
	rendering := !rs.Failing(now)
	v := ix.View(now)
	for _, rep := range s.Fleet.Replicas() {
		ev := s.precise.events.Status(rep)
		if !ev.Followed {
			continue
		}
		rejected := map[string]uint64{}
		ev.Rejected.Each(func(reason string, n uint64) { rejected[reason] = n })
		st.Replicas = append(st.Replicas, telemetry.PreciseReplica{Name: rep.Name(), Precise: v.Precise(rep) && rendering,
			LagSeconds: ev.Lag.Seconds(), Gaps: ev.Gaps, Replays: ev.Replays, Resets: ev.Resets,
			Stored: ev.Stored, Removed: ev.Removed, Blocks: uint64(max(ev.Blocks, 0)), Rejected: rejected,
			LeftOut: map[string]uint64{"unplaceable": ev.Unplaceable, "skipped": ev.Skipped, "unknown_removed": ev.UnknownRemoved}})
	}
	return st
}

// rendering reports whether renders succeed at now: a replica is precise
// while its events are live and this holds.
func (pm *preciseMode) rendering(now time.Time) bool { return !pm.render.Stats().Failing(now) }

// exactKeys is the Router's Exact: the renderer's tokens, keyed as the
// engines' events are.
type exactKeys struct {
	r     *precise.Renderer
	block int
}

var toksPool = sync.Pool{New: func() any { return new([]uint32) }}

func (e exactKeys) ExactKey(dst []uint32, kind oai.Kind, model string, body []byte) ([]uint32, int, bool) {
	bp := toksPool.Get().(*[]uint32)
	defer toksPool.Put(bp)
	toks, whole, err := e.r.RenderPrefix(context.Background(), kind, body, (*bp)[:0])
	*bp = toks[:0]
	if err != nil || len(toks) == 0 {
		return dst, 0, false
	}
	n := len(toks)
	if !whole {
		n = 0 // a prefix: the prompt's size is the approximate key's
	}
	return tokenize.AppendExactKey(dst, model, toks, e.block), n, true
}

// startPrecise starts following the replicas' events for as long as ctx
// lasts.
func (s *Server) startPrecise(ctx context.Context) {
	if s.precise == nil {
		return
	}
	s.precise.mu.Lock()
	s.precise.ctx = ctx
	s.precise.mu.Unlock()
	s.syncFollows()
	go func() {
		<-ctx.Done()
		s.precise.render.Close()
	}()
}

// syncFollows follows the events of every replica whose spec names them,
// at its current endpoints, and stops following replicas that left or
// changed.
func (s *Server) syncFollows() {
	pm := s.precise
	if pm == nil {
		return
	}
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.ctx == nil {
		return
	}
	want := map[*backends.Replica]precise.Endpoint{}
	for _, rep := range s.Fleet.Replicas() {
		if ep, ok := eventEndpoint(rep); ok {
			want[rep] = ep
		}
	}
	for rep, ep := range pm.follows {
		if w, ok := want[rep]; !ok || w != ep {
			pm.events.Stop(rep)
			delete(pm.follows, rep)
		}
	}
	for rep, ep := range want {
		if _, ok := pm.follows[rep]; ok {
			continue
		}
		if err := pm.events.Follow(pm.ctx, rep, ep); err != nil {
			pm.log.Warn("precise: cannot follow the replica's KV events; it stays approximate",
				zap.String("replica", rep.Name()), zap.Error(err))
			continue
		}
		pm.follows[rep] = ep
	}
}

// eventEndpoint is where rep's events are read: its spec's endpoints with
// a host of "*" or none replaced by the replica's own host.
func eventEndpoint(rep *backends.Replica) (precise.Endpoint, bool) {
	sp := rep.Spec()
	if sp.KVEvents.Endpoint == "" {
		return precise.Endpoint{}, false
	}
	u, err := url.Parse(sp.URL)
	if err != nil {
		return precise.Endpoint{}, false
	}
	host := u.Hostname()
	ep := sp.KVEvents
	if ep.Bind {
		ep.Endpoint = withHost(ep.Endpoint, "")
	} else {
		ep.Endpoint = withHost(ep.Endpoint, host)
	}
	ep.ReplayEndpoint = withHost(ep.ReplayEndpoint, host)
	return ep, true
}

// withHost puts host in a tcp://host:port endpoint whose host is "*" or
// empty.
func withHost(ep, host string) string {
	if ep == "" {
		return ""
	}
	u, err := url.Parse(ep)
	if err != nil {
		return ep
	}
	h, port, err := net.SplitHostPort(u.Host)
	if err != nil || (h != "" && h != "*") {
		return ep
	}
	return "tcp://" + net.JoinHostPort(host, port)
}
