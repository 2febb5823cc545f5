package runner

import (
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// DemoOptions returns the options of kvroute demo: a short multi-turn chat
// workload (40 users in 6-turn sessions sharing 4 system prompts of 1,500
// tokens, each turn adding a 1,500-token user message and resending the
// conversation so far, up to ~10,000 tokens) on 4 simulated llama-8b-h100
// replicas at time scale 0.2, through kvroute cache_aware, kvroute
// round_robin and nginx (round-robin) when it is installed. The load keeps
// the replicas busy but below saturation, so the difference comes from the
// prefill work each router saves rather than from queueing collapse. It
// takes about 8 s per router on a 2-core machine and needs no trace file,
// GPU or network.
func DemoOptions() Options {
	o := DefaultOptions()
	o.Workload = workloadMultiTurn
	o.MultiTurn = load.MultiTurnOptions{
		Users:         40,
		SystemPrompts: 4,
		SystemTokens:  1500,
		Turns:         6,
		Think:         2 * time.Second,
		UserTokens:    1500,
		AnswerTokens:  120,
		Duration:      20 * time.Second,
		Seed:          7,
	}
	o.Replicas = 4
	// 0.2 rather than 0.1: real overheads (HTTP, scheduling on a busy
	// laptop) are inflated 5× instead of 10× in the report.
	o.TimeScale = 0.2
	o.Routers = []string{"cache_aware", "round_robin"}
	if _, err := FindBinary("", "nginx"); err == nil {
		o.Routers = append(o.Routers, "nginx")
	}
	return o
}
