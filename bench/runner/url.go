package runner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// RunURL replays the workload o names against the OpenAI-compatible base
// URL url (a real fleet, another router, or kvroute in front of either) and
// reports it like Run, with one result named after the URL.
//
// It runs in real time: TimeScale belongs to the simulated fleet Run starts
// and is ignored here (the report says 1), so arrivals, think times, the
// TTFT target and the request timeout are taken as given and every figure
// is a measured one. RateScale still multiplies the arrival rate. The fleet
// options (Replicas, Preset, Routers, NginxPath, HAProxyPath,
// StreamFlushInterval) do not apply. The replicas' own counters are out of
// reach, so the hit rate reported is the endpoint's: cached prompt tokens
// from usage.prompt_tokens_details, where it sends them. When o.Out is set
// the report files are written there. If ctx ends, RunURL returns what it
// measured with ctx's error.
func RunURL(ctx context.Context, url string, o Options) (*Report, error) {
	o.TimeScale = 1
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	url = strings.TrimRight(url, "/")
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return nil, fmt.Errorf("url %q: want an http:// or https:// base URL", url)
	}
	if o.Workload == workloadNoisy && (o.Noisy.VictimRate == 0 || o.Noisy.AggressorRate == 0) {
		return nil, errors.New("the noisy workload against a URL needs both tenants' rates (--noisy-victim-rate, --noisy-aggressor-rate): the endpoint's capacity is not known")
	}
	if err := o.Bound.check(); err != nil {
		return nil, err
	}
	w, err := BuildWorkload(o)
	if err != nil {
		return nil, err
	}
	rep := workloadReport(&o, w, o.Workload, o.Model, load.DefaultHitBlockTokens)
	rep.Target = url
	if o.Workload == workloadNoisy {
		rep.Noisy = newNoisyRun(&o, noisyPlan{victimRate: o.Noisy.VictimRate * o.RateScale, aggressorRate: o.Noisy.AggressorRate * o.RateScale})
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return nil, err
		}
	}
	reuseBefore := o.Bound.reuseSince(nil)
	bar := newBar(o.Progress, int64(len(w.Requests)))
	bar.describe(url)
	start := time.Now()
	res := RouterResult{Router: url}
	out, runErr := load.Run(ctx, url, w, load.RunOptions{
		Model:    o.Model,
		Timeout:  o.RequestTimeout,
		OnDone:   func(int, load.Sample) { bar.add() },
		KeepSent: o.Bound.RenderURL != "",
	})
	bar.finish()
	res.Wall = time.Since(start).Seconds()
	rep.Wall = res.Wall
	if out == nil {
		return nil, runErr
	}
	if runErr != nil {
		res.Error = runErr.Error()
	}
	res.Summary = out.Summarize(o.TTFTTarget, 1)
	res.TTFTCDF = out.TTFTCDF(200, 1)
	res.Tenants = tenantResults(w, out, &o)
	res.fillSpread(out)
	if reuseBefore != nil {
		res.Reuse = o.Bound.reuseSince(reuseBefore)
	}
	if o.Bound.RenderURL != "" && ctx.Err() == nil {
		toks, err := o.Bound.renderSent(ctx, o.Model, out.Sent)
		if err != nil {
			return nil, errors.Join(runErr, fmt.Errorf("the bound: %w", err))
		}
		rep.Oracle, rep.Replicas, rep.BlockSize = o.Bound.oracleOf(w, toks), o.Bound.Replicas, o.Bound.BlockTokens
		res.HitTokens = reportedHits(out)
		res.scoreAgainst(rep.Oracle)
	}
	rep.Results = []RouterResult{res}
	if o.Out != "" {
		if err := rep.WriteFiles(o.Out); err != nil {
			return rep, errors.Join(runErr, err)
		}
	}
	return rep, runErr
}

// fillSpread records how the requests spread over the replicas that
// answered, as named by the X-Kvroute-Backend header (kvroute sets it;
// other endpoints leave it empty, and nothing is recorded).
func (res *RouterResult) fillSpread(out *load.Result) {
	counts := make(map[string]int64)
	var total, most int64
	for i := range out.Samples {
		s := &out.Samples[i]
		if !s.Sent || s.Replica == "" {
			continue
		}
		counts[s.Replica]++
		total++
		most = max(most, counts[s.Replica])
	}
	if total == 0 {
		return
	}
	order := slices.Sorted(maps.Keys(counts))
	for _, name := range order {
		res.Replicas = append(res.Replicas, ReplicaShare{Name: name, Requests: counts[name], RequestShare: ratio(counts[name], total)})
	}
	res.RequestImbalance = float64(most) * float64(len(order)) / float64(total)
}
