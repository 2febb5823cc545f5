package server

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/precise"
	"github.com/kvroute/kvroute/telemetry"
)

// A replica's routing state (kvroute_backend_routing_state, /debug/backends):
// exact while the Index follows its engine's KV events and renders
// succeed; approximate by configuration (no kv_events, or precise mode
// off); degraded, with one of the reasons below, while precise mode was
// asked for and cannot be had: the replica is then routed on the
// approximate key.
const (
	stateExact       = "exact"
	stateApproximate = "approximate"
	stateDegraded    = "degraded"
)

// The reasons of a routing state: a bounded set.
const (
	reasonNone               = ""
	reasonConfigured         = "configured"          // approximate: no kv_events, or precise mode off
	reasonRenderNotServed    = "render_not_served"   // neither render nor /tokenize is served
	reasonRenderFailing      = "render_failing"      // renders time out or fail
	reasonEventsDisconnected = "events_disconnected" // the event socket is not connected
	reasonEventsRejected     = "events_rejected"     // kvroute closed it for what the engine sent
	reasonEventsUnplaceable  = "events_unplaceable"  // events arrive but place almost nothing
	reasonEventsSilent       = "events_silent"       // no event past precise.max_event_silence while requests went
	reasonEventsWaiting      = "events_waiting"      // connected, no batch yet since the follow or a gap past replay
	reasonTokenizerMismatch  = "tokenizer_mismatch"  //nolint:gosec // a reason, no credential: rendered prompt lengths mostly differ from the engine's
)

// routingState is a replica's state and its reason.
type routingState struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// routingStateOf returns rep's routing state at now, rs being the
// renderer's stats of now.
func (s *Server) routingStateOf(rep *backends.Replica, rs *precise.RenderStats, now time.Time) routingState {
	if s.precise == nil {
		return routingState{stateApproximate, reasonConfigured}
	}
	ev := s.precise.events.Status(rep)
	if !ev.Followed {
		return routingState{stateApproximate, reasonConfigured}
	}
	rendering := !rs.Failing(now)
	switch {
	case ev.Live && rendering:
		return routingState{stateExact, reasonNone}
	case !rendering && rs.FallbackNotServed > 0:
		return routingState{stateDegraded, reasonRenderNotServed}
	case !rendering:
		return routingState{stateDegraded, reasonRenderFailing}
	case rep.TokenizerMismatch():
		return routingState{stateDegraded, reasonTokenizerMismatch}
	case !ev.Connected && ev.Rejected.Total() > ev.Rejected[kvevents.PeerRefused]:
		return routingState{stateDegraded, reasonEventsRejected}
	case !ev.Connected:
		return routingState{stateDegraded, reasonEventsDisconnected}
	case precise.Unplaceable(ev.Stored, ev.Unplaceable):
		return routingState{stateDegraded, reasonEventsUnplaceable}
	case ev.Batches > 0 && s.precise.maxSilence > 0 && now.Sub(ev.LastEvent) > s.precise.maxSilence:
		return routingState{stateDegraded, reasonEventsSilent}
	}
	return routingState{stateDegraded, reasonEventsWaiting}
}

// routingStates returns every replica's routing state now.
func (s *Server) routingStates(now time.Time) map[*backends.Replica]routingState {
	var rs precise.RenderStats
	if s.precise != nil {
		rs = s.precise.render.Stats()
	}
	out := map[*backends.Replica]routingState{}
	for _, rep := range s.Fleet.Replicas() {
		out[rep] = s.routingStateOf(rep, &rs, now)
	}
	return out
}

// routingStateMetrics is kvroute_backend_routing_state's source.
func (s *Server) routingStateMetrics() []telemetry.RoutingState {
	states := s.routingStates(time.Now())
	out := make([]telemetry.RoutingState, 0, len(states))
	for rep, st := range states {
		out = append(out, telemetry.RoutingState{Backend: rep.Name(), State: st.State, Reason: st.Reason})
	}
	return out
}

// routingStateEvery is how often the routing states are looked at for
// their transitions.
const routingStateEvery = time.Second

// watchRoutingStates logs one line per transition of a replica's routing
// state until ctx ends: a warning when it becomes degraded, naming what
// to fix.
func (s *Server) watchRoutingStates(ctx context.Context) {
	var last map[*backends.Replica]routingState
	t := time.NewTicker(routingStateEvery)
	defer t.Stop()
	for {
		now := s.routingStates(time.Now())
		for rep, st := range now {
			prev, seen := last[rep]
			if prev == st || !seen && st.State != stateDegraded {
				continue
			}
			fields := []zap.Field{zap.String("replica", rep.Name()), zap.String("state", st.State), zap.String("reason", st.Reason),
				zap.String("was", prev.State)}
			if st.State == stateDegraded {
				s.log.Warn("replica routed on the approximate key: "+degradedHelp[st.Reason], fields...)
			} else {
				s.log.Info("replica routing state", fields...)
			}
		}
		last = now // replicas that left are forgotten
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// degradedHelp says, for each reason of a degraded state, what is wrong
// and what fixes it.
var degradedHelp = map[string]string{
	reasonRenderNotServed: "the render endpoint is not served: vLLM after v0.29 serves render only with --enable-scale-out, " +
		"or as its own process (vllm launch render); point precise.render_url at one",
	reasonRenderFailing:      "renders of precise.render_url time out or fail",
	reasonEventsDisconnected: "its KV-event socket is not connected (backends[].kv_events.endpoint)",
	reasonEventsRejected:     "its KV-event connection was closed for what it sent (kvroute_kv_events_rejected_total)",
	reasonEventsUnplaceable: "its KV events place almost none of the blocks they store (kvroute_kv_events_left_out_total{reason=\"unplaceable\"}): " +
		"their parent hashes name blocks it never reported",
	reasonEventsSilent:  "its KV events stopped while requests went to it (precise.max_event_silence)",
	reasonEventsWaiting: "no KV-event batch yet since it was followed or since a gap its replay could not fill",
	reasonTokenizerMismatch: "the prompt lengths precise.render_url gives mostly differ from the prompt_tokens its engine reports: " +
		"the renderer tokenizes otherwise (another model, tokenizer or chat template); point precise.render_url at the engine or a render process of the same model",
}
