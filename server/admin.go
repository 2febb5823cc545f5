package server

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"
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
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
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
