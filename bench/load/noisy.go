package load

import (
	"fmt"
	"math"
	"time"
)

// Namespaces of the noisy workload's streams: each tenant has its own
// arrivals and prompts, so that the victim's requests are the same with
// or without the aggressor.
var (
	tagNoisyVictim    = strSeed("noisy-victim")
	tagNoisyAggressor = strSeed("noisy-aggressor")
)

// Default tenant names of Noisy.
const (
	DefaultVictim    = "victim"
	DefaultAggressor = "aggressor"
)

// NoisyOptions configures Noisy. Rates are in requests per second and
// durations in the time of the run (the caller scales them).
type NoisyOptions struct {
	// VictimRate is the victim's arrival rate (Poisson) over the whole
	// run, Warmup + Flood + Cooldown.
	VictimRate float64
	// AggressorRate is the aggressor's arrival rate (Poisson) during the
	// flood; 0 leaves the aggressor out: the victim alone, with the very
	// requests it sends beside the aggressor.
	AggressorRate float64
	// Warmup is the victim-only time before the flood, Flood how long the
	// aggressor sends, Cooldown the victim-only time after it.
	Warmup, Flood, Cooldown time.Duration
	// PromptTokens is each request's prompt, one user message of unique
	// text (default 500); MaxTokens its max_tokens (default 32).
	PromptTokens, MaxTokens int
	// Victim and Aggressor are the tenants' names, sent in the tenant
	// header (defaults DefaultVictim and DefaultAggressor).
	Victim, Aggressor string
	// Seed makes the workload reproducible.
	Seed uint64
}

// FloodWindow returns the span of arrival offsets [start, end) in which
// the aggressor sends.
func (o *NoisyOptions) FloodWindow() (start, end time.Duration) {
	return o.Warmup, o.Warmup + o.Flood
}

// Noisy returns a noisy-neighbour workload: two tenants sending one-shot
// chats of the same kind (a unique prompt of PromptTokens, MaxTokens of
// answer, no prefix shared with any other request), the victim at a
// steady VictimRate for the whole run, the aggressor at AggressorRate
// during the flood only. Every request carries its tenant (Request.Tenant).
// Each tenant's arrivals and texts come from a stream of its own, so the
// victim's requests do not depend on the aggressor's options.
func Noisy(opt NoisyOptions) *Workload {
	prompt, maxTok := cmpOr(opt.PromptTokens, 500), cmpOr(opt.MaxTokens, 32)
	victim, aggressor := opt.Victim, opt.Aggressor
	if victim == "" {
		victim = DefaultVictim
	}
	if aggressor == "" {
		aggressor = DefaultAggressor
	}
	start, end := opt.FloodWindow()
	w := &Workload{Name: fmt.Sprintf("noisy(prompt=%d,answer=%d)", prompt, maxTok)}
	add := func(tenant string, tag uint64, from, to time.Duration, rate float64) {
		for i, at := range arrivalsWithin(rate, from, to, mix(tag, opt.Seed)) {
			msgs := []Message{{Role: roleUser, Content: synthText(mix(tag, opt.Seed, uint64(i)), prompt)}}
			k := appendTurn(w, msgs, "", at, maxTok, -1, -1, 0)
			w.Requests[k].Tenant = tenant
		}
	}
	add(victim, tagNoisyVictim, 0, end+opt.Cooldown, opt.VictimRate)
	add(aggressor, tagNoisyAggressor, start, end, opt.AggressorRate)
	sortByArrival(w.Requests)
	return w
}

// arrivalsWithin returns the arrival offsets of a Poisson process of rate
// req/s started at from, up to (not including) to; none when rate is not
// positive.
func arrivalsWithin(rate float64, from, to time.Duration, seed uint64) []time.Duration {
	if rate <= 0 || math.IsInf(rate, 0) || math.IsNaN(rate) || to <= from {
		return nil
	}
	r := splitmix64{seed}
	var out []time.Duration
	t := from.Seconds()
	for {
		t = r.nextArrival(t, rate)
		at := time.Duration(t * float64(time.Second))
		if at >= to {
			return out
		}
		out = append(out, at)
	}
}
