package proxy

import "go.uber.org/zap"

// The reuse of a request's prompt, split (kvroute_reuse_tokens_total): of
// the prompt tokens its engine reports, those it found cached are
// delivered; of the rest, those a better-placed candidate was believed to
// hold are the routing's loss (the choice gave them up, for load); those
// the chosen replica was believed to hold but did not are the Index's
// loss (an eviction, a stale view, a salt or adapter it keyed
// differently); what is left no replica was believed to hold: the
// workload's miss. The four always sum to the prompt.

// Reuse kinds, the label values of kvroute_reuse_tokens_total and the
// access line's counts.
const (
	ReuseDelivered    = "delivered"
	ReuseRoutingLoss  = "routing_loss"
	ReuseIndexLoss    = "index_loss"
	ReuseWorkloadMiss = "workload_miss"
)

// Reuse is one request's prompt tokens, split.
type Reuse struct {
	Delivered, RoutingLoss, IndexLoss, WorkloadMiss int
}

// splitReuse splits prompt tokens, cached of which the engine found,
// where the chosen replica was believed to hold matched and the best
// candidate best.
func splitReuse(prompt, cached, matched, best int) Reuse {
	prompt = max(prompt, 0)
	r := Reuse{Delivered: min(max(cached, 0), prompt)}
	left := prompt - r.Delivered
	r.IndexLoss = min(max(min(matched, prompt)-r.Delivered, 0), left)
	left -= r.IndexLoss
	// What the best holder was believed to hold beyond both the choice's
	// prediction and what the engine delivered anyway.
	r.RoutingLoss = min(max(best-max(matched, r.Delivered), 0), left)
	r.WorkloadMiss = left - r.RoutingLoss
	return r
}

// reuseObserver is an Observer that counts the reuse split and the
// decisions that chose a candidate with the best match (telemetry.Metrics).
type reuseObserver interface {
	Reuse(backend string, delivered, routingLoss, indexLoss, workloadMiss int)
	BestOverlap(best bool)
}

// observeReuse counts a request's reuse split on backend, and keeps it for
// its access line.
func (p *Proxy) observeReuse(o *outcome, backend string, prompt, cached, matched, best int) {
	r := splitReuse(prompt, cached, matched, best)
	if o != nil {
		o.reuse, o.reuseSeen = r, true
	}
	if ro, ok := p.obs.(reuseObserver); ok {
		ro.Reuse(backend, r.Delivered, r.RoutingLoss, r.IndexLoss, r.WorkloadMiss)
	}
}

// observeBest counts a decision, with whether it chose a candidate
// believed to hold the longest match.
func (p *Proxy) observeBest(matched, best int) {
	if ro, ok := p.obs.(reuseObserver); ok {
		ro.BestOverlap(matched >= best)
	}
}

// reuseField is an access line's count of kind ("delivered_tokens", ...),
// left out before the engine's usage gave it.
func reuseField(kind string, n int, seen bool) zap.Field {
	if !seen {
		return zap.Skip()
	}
	return zap.Int(kind+"_tokens", n)
}
