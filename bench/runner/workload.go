package runner

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// BuildWorkload builds the workload o names, with arrivals and think times
// scaled to real time (multiplied by TimeScale, divided by RateScale) and
// cut to Limit requests.
func BuildWorkload(o Options) (*load.Workload, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	scale := o.TimeScale / o.RateScale // real seconds per unscaled second of arrivals
	scaleDur := func(d time.Duration, by float64) time.Duration { return time.Duration(float64(d) * by) }
	var w *load.Workload
	if shape, ok := strings.CutPrefix(o.Workload, FamilyWorkloadPrefix); ok {
		f := FamilyOptions{Options: o, Seed: o.MultiTurn.Seed, Scale: 1, MooncakeTrace: o.Mooncake.TracePath, AzureTrace: o.NoReuse.AzurePath}
		if w, err = f.build(shape, &o); err != nil {
			return nil, err
		}
	}
	switch o.Workload {
	case workloadMooncake:
		w, err = load.Mooncake(o.Mooncake.TracePath, load.MooncakeOptions{
			TimeScale:    o.TimeScale,
			RateScale:    o.RateScale,
			Limit:        o.Limit,
			MaxTokensCap: o.Mooncake.MaxTokensCap,
			StartAt:      o.Mooncake.StartAt,
		})
		if err != nil {
			var te *load.TraceError
			if errors.As(err, &te) {
				return nil, err
			}
			return nil, fmt.Errorf("mooncake trace: %w", err)
		}
	case workloadMultiTurn:
		mt := o.MultiTurn
		// Think time is the user's, not the arrival process's: scaled with
		// simulated time only. The spread of first turns is the arrival rate.
		mt.Think = scaleDur(mt.Think, o.TimeScale)
		mt.Duration = scaleDur(mt.Duration, scale)
		w = load.MultiTurn(mt)
	case workloadHotPrefix:
		hp := o.HotPrefix
		hp.Rate = hp.Rate / scale
		if o.Limit > 0 && (hp.N == 0 || hp.N > o.Limit) {
			hp.N = o.Limit
		}
		w = load.HotPrefix(hp)
	case workloadNoReuse:
		nr := o.NoReuse
		nr.Rate = nr.Rate / scale
		nr.TimeScale = scale
		if o.Limit > 0 && (nr.N == 0 || nr.N > o.Limit) {
			nr.N = o.Limit
		}
		if w, err = load.NoReuse(nr); err != nil {
			var te *load.TraceError
			if errors.As(err, &te) {
				return nil, err
			}
			return nil, fmt.Errorf("noreuse: %w", err)
		}
	case workloadNoisy:
		simCfg, err := o.simConfig()
		if err != nil {
			return nil, err
		}
		// The phases keep their length whatever RateScale: it multiplies
		// the rates (noisyPlan).
		w = load.Noisy(o.noisyPlan(simCfg).loadOptions(&o, false))
	}
	if o.Limit > 0 && len(w.Requests) > o.Limit {
		// Requests are in arrival order and a turn depends only on an
		// earlier one, so a prefix of the list is self-contained.
		w.Requests = w.Requests[:o.Limit]
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("workload %s has no requests", w.Name)
	}
	return w, nil
}
