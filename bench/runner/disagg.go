package runner

import (
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
)

// split is one disaggregated fleet of Options.Disaggregated.
type split struct {
	label string   // "P:D"
	roles []string // one per replica: the P prefill replicas first
}

// splits parses o.Disaggregated and checks DisaggregationProtocol.
func (o *Options) splits() ([]split, error) {
	if err := config.CheckProtocol(o.DisaggregationProtocol); err != nil {
		return nil, fmt.Errorf("disaggregation protocol %q: %w", o.DisaggregationProtocol, err)
	}
	var out []split
	for _, raw := range o.Disaggregated {
		p, d, err := sim.ParseSplit(raw)
		if err != nil {
			return nil, fmt.Errorf("disaggregated: %w", err)
		}
		if p+d != o.Replicas {
			return nil, fmt.Errorf("disaggregated %q: %d+%d replicas, want the fleet's %d (--replicas)", raw, p, d, o.Replicas)
		}
		roles := make([]string, 0, p+d)
		for range p {
			roles = append(roles, sim.RolePrefill)
		}
		for range d {
			roles = append(roles, sim.RoleDecode)
		}
		out = append(out, split{label: strconv.Itoa(p) + ":" + strconv.Itoa(d), roles: roles})
	}
	return out, nil
}

// withSplits returns routers followed, for each split of o, by a twin of
// each kvroute router (not precise) in front of that split fleet.
func withSplits(routers []Router, o *Options) []Router {
	splits, _ := o.splits() // checked by withDefaults
	protocol := disaggregationProtocol(o)
	out := routers
	for _, sp := range splits {
		for _, r := range routers {
			k, ok := r.(*Kvroute)
			if !ok || k.Precise {
				continue
			}
			split := &Kvroute{Policy: k.Policy, Flow: k.Flow, Roles: sp.roles, Split: sp.label, Protocol: protocol}
			if k.Policy == router.CacheAwareName && protocol == config.ProtocolVLLM { // the policy that keys prompts; SGLang cannot
				split.LocalPrefill = router.LocalPrefill{Tokens: o.LocalPrefillTokens, Backlog: o.LocalPrefillBacklog, MaxRunning: o.LocalPrefillMaxRunning}
			}
			out = append(out, split)
		}
	}
	return out
}

// prefillReplicas counts the prefill replicas of roles.
func prefillReplicas(roles []string) int {
	n := 0
	for _, r := range roles {
		if r == sim.RolePrefill {
			n++
		}
	}
	return n
}

// disaggregationProtocol is o's disaggregated fleets' protocol: vllm
// unless o names another; empty when o has no such fleet.
func disaggregationProtocol(o *Options) string {
	switch {
	case len(o.Disaggregated) == 0:
		return ""
	case o.DisaggregationProtocol == "":
		return config.ProtocolVLLM
	}
	return o.DisaggregationProtocol
}
