package server

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/precise"
	"github.com/kvroute/kvroute/router"
)

// AdminHandler serves the admin API: liveness, readiness, metrics, replica
// state and profiling. bound is the address the admin listener is bound to:
// when it is not a loopback address and auth.admin_token is empty, only
// /healthz, /readyz and /metrics are served to clients that are not on
// loopback themselves.
func (s *Server) AdminHandler(bound string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeStatus(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.draining.Load() {
			writeStatus(w, http.StatusServiceUnavailable, "draining")
			return
		}
		for _, r := range s.Fleet.Replicas() {
			if r.Healthy() {
				writeStatus(w, http.StatusOK, "ready")
				return
			}
		}
		writeStatus(w, http.StatusServiceUnavailable, "no healthy replica")
	})
	mux.HandleFunc("GET /debug/backends", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.backendsState(time.Now()))
	})
	mux.HandleFunc("GET /debug/flow", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.Proxy.FlowStats())
	})
	mux.HandleFunc("POST /debug/route", s.debugRoute)
	mux.HandleFunc("GET /debug/tree", s.debugTree)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return s.adminAuth(loopbackAddr(bound), mux)
}

// adminAuth requires auth.admin_token as a bearer token, when one is set,
// on everything but the probes. Without a token, a listener bound to a
// loopback address serves everything; another serves only the probes and
// /metrics to clients that are not on loopback.
func (s *Server) adminAuth(loopbackBound bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := s.Config().Auth.AdminToken
		if token == "" && !loopbackBound && !adminPublic(r.URL.Path) && !loopbackAddr(r.RemoteAddr) {
			writeJSON(w, http.StatusForbidden, oaiError(oai.NewError(http.StatusForbidden,
				"permission_error", "admin_token_required",
				"this admin listener is not bound to a loopback address and has no token, so it serves only /healthz, /readyz and /metrics: "+
					"set auth.admin_token (and send Authorization: Bearer <token>) or bind admin_listen to 127.0.0.1")))
			return
		}
		if token != "" && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			got := r.Header.Get("Authorization")
			want := "Bearer " + token
			if subtle.ConstantTimeCompare([]byte(got), []byte(want)) != 1 {
				w.Header().Set("WWW-Authenticate", "Bearer")
				writeJSON(w, http.StatusUnauthorized, oaiError(oai.NewError(http.StatusUnauthorized,
					"invalid_request_error", "invalid_admin_token", "the admin API needs Authorization: Bearer <auth.admin_token>")))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// adminPublic reports whether path is served to anyone on an admin listener
// without a token: the probes and the metrics. The path must match exactly,
// so no spelling of another path passes.
func adminPublic(path string) bool {
	return path == "/healthz" || path == "/readyz" || path == "/metrics"
}

// loopbackAddr reports whether addr (host:port, or a bare host) names only
// loopback: a loopback IP or "localhost". An unspecified host (":9090",
// "0.0.0.0:9090", "[::]:9090") and any other name are not loopback.
func loopbackAddr(addr string) bool {
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i] // an IPv6 zone
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// adminExposed reports whether an admin listener bound to bound with token
// serves only the probes and /metrics to clients off loopback.
func adminExposed(bound, token string) bool { return token == "" && !loopbackAddr(bound) }

// adminErrorLog sends net/http's own messages (TLS handshake errors and the
// like) to the debug log.
func adminErrorLog(l *zap.Logger) *log.Logger {
	std, err := zap.NewStdLogAt(l.Named("admin"), zap.DebugLevel)
	if err != nil {
		return zap.NewStdLog(l.Named("admin"))
	}
	return std
}

type backendState struct {
	Name   string `json:"name"`
	URL    string `json:"url"`
	Engine string `json:"engine"`
	// DataParallelRank is the engine rank the replica stands for, when its
	// backend has data_parallel_size above 1.
	DataParallelRank *int  `json:"data_parallel_rank,omitempty"`
	Healthy          bool  `json:"healthy"`
	InFlight         int64 `json:"in_flight"`
	// PeerInFlight is the other cluster instances' requests in flight to
	// it, as they last reported them (0 without a cluster).
	PeerInFlight int64    `json:"peer_in_flight"`
	Models       []string `json:"models"`
	// RecentPrefill is the prefill work counted on it, this instance's and
	// its peers', in tokens decayed by half every index.ttl (as the
	// engines reported it where they did): what cache_aware's work cap and
	// branch rule weigh. 0 without an index.
	RecentPrefill int64  `json:"recent_prefill_tokens"`
	LastError     string `json:"last_error,omitempty"`
	Metrics       any    `json:"metrics,omitempty"`
	Fresh         bool   `json:"metrics_fresh"`
	// Mode is "precise" while the Index follows the replica's engine
	// events and renders succeed, else "approximate"; empty when precise
	// mode is off.
	Mode string `json:"mode,omitempty"`
	// KVEvents is what is followed of its events (precise mode only).
	KVEvents *precise.ReplicaStatus `json:"kv_events,omitempty"`
	// RoutingState is exact, approximate or degraded, with its reason
	// (routing_state.go).
	RoutingState routingState `json:"routing_state"`
}

func (s *Server) backendsState(now time.Time) []backendState {
	reps := s.Fleet.Replicas()
	if len(reps) == 0 {
		return nil // null, as an empty fleet has always answered
	}
	out := make([]backendState, 0, len(reps))
	rendering := s.precise != nil && s.precise.rendering(now)
	var v index.View
	ix := s.Router.Index()
	if ix != nil {
		v = ix.View(now)
	}
	states := s.routingStates(now)
	for _, r := range reps {
		sp := r.Spec()
		st := backendState{Name: sp.Name, URL: sp.URL, Engine: string(sp.Engine), Healthy: r.Healthy(),
			InFlight: r.InFlight(), PeerInFlight: r.PeerInFlight(), Models: r.Models(), LastError: r.LastError(), Fresh: r.Fresh(now),
			RoutingState: states[r],
		}
		if ix != nil {
			st.RecentPrefill = int64(math.Round(v.RecentWork(r)))
		}
		if rank, ok := r.DataParallelRank(); ok {
			st.DataParallelRank = &rank
		}
		if snap := r.Snapshot(); snap != nil {
			st.Metrics = snap
		}
		if s.precise != nil {
			st.Mode = "approximate"
			if ix != nil && v.Precise(r) && rendering {
				st.Mode = "precise"
			}
			ev := s.precise.events.Status(r)
			st.KVEvents = &ev
		}
		out = append(out, st)
	}
	return out
}

// writeStatus answers {"status": status}, the body of the health checks.
func writeStatus(w http.ResponseWriter, code int, status string) {
	writeJSON(w, code, map[string]string{"status": status})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// debugRoute answers POST /debug/route: the decision a request body would
// get, with every replica's score, without forwarding it. The endpoint is
// given by ?path= (default /v1/chat/completions); the session by the
// configured session header. It changes nothing: no rotation, Index
// entry, session binding, counter or render (Router.PrepareToExplain,
// Router.Explain), so the request's next real decision is the one shown
// (but for ties broken at random, and in precise mode, where it is scored
// on the approximate key).
//
// The reason, the match length and the scores say whether a prompt is
// cached, whoever sent it: they are in the answer when auth.admin_token
// is set (adminAuth then let only its holder in) or expose_route_reason
// is true. Otherwise the listener serves anyone who reaches its address
// (on loopback: any local process), and the answer names the replica and
// the key's size only.
func (s *Server) debugRoute(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if path == "" {
		path = "/v1/chat/completions"
	}
	kind := oai.KindForPath(path)
	if kind == oai.KindOther {
		writeJSON(w, http.StatusBadRequest, oaiError(oai.BadRequest("path "+path+" is not routed by prompt", "path")))
		return
	}
	cfg := s.Config()
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(cfg.Limits.MaxBodyBytes)+1))
	if err != nil || len(body) > cfg.Limits.MaxBodyBytes {
		writeJSON(w, http.StatusRequestEntityTooLarge, oaiError(oai.NewError(http.StatusRequestEntityTooLarge,
			"invalid_request_error", "body_too_large", "request body too large or unreadable")))
		return
	}
	var bufs oai.Buffers
	var req router.Request
	if err := s.Router.PrepareToExplain(&bufs, kind, body, []byte(r.Header.Get(cfg.Session.Header)), &req); err != nil {
		var e *oai.Error
		if !errors.As(err, &e) {
			e = oai.BadRequest(err.Error(), "")
		}
		writeJSON(w, e.Status, oaiError(e))
		return
	}
	defer s.Router.Release(&req)
	dec, scores, err := s.Router.Explain(&req)
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, router.ErrNoExplain) {
			status = http.StatusNotImplemented
		}
		writeJSON(w, status, map[string]string{"error": err.Error()})
		return
	}
	out := map[string]any{
		"policy":     s.Router.Policy().Name(),
		"replica":    dec.Replica.Name(),
		"key_tokens": req.Tokens,
		"key_blocks": len(req.Key),
	}
	if cfg.Auth.AdminToken != "" || cfg.ExposeRouteReason {
		out["route"], out["matched"], out["scores"] = dec.Reason, dec.Matched, scores
	} else {
		out["route_hidden"] = "set auth.admin_token, or expose_route_reason: true, for the reason, the match length and the scores"
	}
	writeJSON(w, http.StatusOK, out)
}

func oaiError(e *oai.Error) json.RawMessage { return e.Body() }

// debugTree answers GET /debug/tree: the prefix tree's size, each replica's
// share of it, and the tokenizer caches' counters.
func (s *Server) debugTree(w http.ResponseWriter, _ *http.Request) {
	out := map[string]any{"policy": s.Router.Policy().Name()}
	if _, ok := s.Router.Policy().(router.IndexUser); ok {
		ix := s.Index()
		st := ix.Stats()
		held, exact := map[string]int64{}, map[string]int64{}
		for _, r := range s.Fleet.Replicas() {
			held[r.Name()] = st.Held[r.ID()]
			exact[r.Name()] = st.HeldExact[r.ID()]
		}
		out["tree"] = map[string]any{"nodes": st.Nodes, "tokens": st.Tokens, "bytes": st.Bytes,
			"bytes_bound": s.Config().Index.TreeMaxBytes, "held_tokens": held, "held_exact_tokens": exact,
			"writes": ix.WritesBySource(), "trims": ix.Trims()}
	}
	if tok := s.Tokenizer(); tok != nil {
		out["tokenizer"] = map[string]any{"encoding": tok.Encoding(), "caches": tok.Stats()}
	}
	writeJSON(w, http.StatusOK, out)
}
