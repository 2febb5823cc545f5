package server

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/radix"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenize"
)

// AdminHandler serves the admin API: liveness, readiness, replica state and
// profiling.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		for _, r := range s.Fleet.Replicas() {
			if r.Healthy() {
				writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
				return
			}
		}
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "no healthy replica"})
	})
	mux.HandleFunc("GET /debug/backends", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.backendsState(time.Now()))
	})
	mux.HandleFunc("POST /debug/route", s.debugRoute)
	mux.HandleFunc("GET /debug/tree", s.debugTree)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.Metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return s.adminAuth(mux)
}

// adminAuth requires auth.admin_token as a bearer token, when one is set,
// on everything but the probes.
func (s *Server) adminAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := s.Config().Auth.AdminToken
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

type backendState struct {
	Name      string   `json:"name"`
	URL       string   `json:"url"`
	Engine    string   `json:"engine"`
	Healthy   bool     `json:"healthy"`
	InFlight  int64    `json:"in_flight"`
	Models    []string `json:"models"`
	LastError string   `json:"last_error,omitempty"`
	Metrics   any      `json:"metrics,omitempty"`
	Fresh     bool     `json:"metrics_fresh"`
}

func (s *Server) backendsState(now time.Time) []backendState {
	var out []backendState
	for _, r := range s.Fleet.Replicas() {
		sp := r.Spec()
		st := backendState{Name: sp.Name, URL: sp.URL, Engine: string(sp.Engine), Healthy: r.Healthy(),
			InFlight: r.InFlight(), Models: r.Models(), LastError: r.LastError(), Fresh: r.Fresh(now)}
		if snap := r.Snapshot(); snap != nil {
			st.Metrics = snap
		}
		out = append(out, st)
	}
	return out
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
// configured session header.
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
	parsed, err := oai.Parse(kind, body)
	if err != nil {
		e := err.(*oai.Error)
		writeJSON(w, e.Status, oaiError(e))
		return
	}
	session := r.Header.Get(cfg.Session.Header)
	if session == "" {
		session = parsed.User
	}
	var req router.Request
	s.keyer.Prepare(parsed, session, &req)
	dec, scores, err := s.Router.Explain(&req)
	if err != nil {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"policy":     s.Router.Policy().Name(),
		"replica":    dec.Replica.Name(),
		"route":      dec.Reason,
		"matched":    dec.Matched,
		"key_tokens": req.Tokens,
		"key_blocks": len(req.Key),
		"scores":     scores,
	})
}

func oaiError(e *oai.Error) json.RawMessage { return e.Body() }

// debugTree answers GET /debug/tree: the prefix tree's size, each replica's
// share of it, and the tokenizer caches' counters.
func (s *Server) debugTree(w http.ResponseWriter, _ *http.Request) {
	out := map[string]any{"policy": s.Router.Policy().Name()}
	if ca, ok := s.Router.Policy().(*router.CacheAware); ok {
		st := ca.Tree().Stats()
		held := map[string]int64{}
		for _, r := range s.Fleet.Replicas() {
			held[r.Name()] = st.Held[radix.ReplicaID(r.ID())]
		}
		out["tree"] = map[string]any{"nodes": st.Nodes, "tokens": st.Tokens, "bytes": st.Bytes,
			"bytes_bound": s.Config().CacheAware.TreeMaxBytes, "held_tokens": held}
	}
	if tok, ok := s.keyer.Tok.(*tokenize.Tokenizer); ok {
		out["tokenizer"] = map[string]any{"encoding": tok.Encoding(), "caches": tok.Stats()}
	}
	writeJSON(w, http.StatusOK, out)
}
