package runner

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/bench/load"
)

// Report file names inside the output directory.
const (
	FileMarkdown = "results.md"
	FileJSON     = "results.json"
	FileSVG      = "results.svg"
)

// WriteFiles writes results.md, results.json and results.svg into dir.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{
		{FileMarkdown, []byte(r.Markdown())},
		{FileJSON, append(js, '\n')},
		{FileSVG, []byte(r.SVG())},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Markdown renders the report: a header describing the setup, the main
// table (one row per router) and a table of each replica's share of
// requests and of prefill work.
func (r *Report) Markdown() string {
	if r.Target != "" {
		return r.targetMarkdown()
	}
	if r.Instances != nil {
		return r.instancesMarkdown()
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## kvroute bench: %s\n\n", r.Workload)
	w("%d requests (%s prompt tokens) on %d × %s replicas per router (model %s, block %d tokens), time scale %g, rate scale %g; %s.\n\n",
		r.Requests, count(r.PromptTokens), r.Replicas, r.Preset, r.Model, r.BlockSize, r.TimeScale, r.RateScale, r.Host)
	w("Ideal prefix-cache hit rate (one server, infinite cache): **%s**. ", pct(r.IdealHitRate))
	if o := r.Oracle; o != nil {
		w("Finite-cache bound (each request on the replica holding its longest cached prefix within %g× the mean prefill work, %d LRU caches of %s tokens): **%s**, prefill max/mean %.2f; *of bound* and *of ideal* are each router's hit tokens as a fraction of theirs. ",
			o.LoadCap, r.Replicas, count(o.CapacityTokens), pct(o.Bound.HitRate), o.Bound.PrefillImbalance)
	}
	w("Times are simulated (unscaled) seconds. *Hit rate* is counted by the replicas (hit / queried prompt tokens")
	if r.hostTier() {
		w(", hits from the GPU cache and from the host-memory offload tier; the host tier's part in brackets")
	}
	w("); ")
	w("*goodput* is successful requests per second with TTFT ≤ %s; *max/mean* compares the busiest replica with the average, for prefill tokens computed and for requests.\n\n", secs(r.TTFTTarget))

	w("| router | ok | errors | hit rate | of bound | of ideal | TTFT p50 | TTFT p90 | TTFT p99 | latency p50 | latency p90 | throughput | goodput | prefill max/mean | requests max/mean |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i := range r.Results {
		res := &r.Results[i]
		s := &res.Summary
		if res.Error != "" && s.Requests == 0 {
			w("| %s | – | – | – | – | – | – | – | – | – | – | – | – | – | – |\n", res.Router)
			continue
		}
		w("| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2f/s | %.2f/s | %.2f | %.2f |\n",
			res.Router, s.OK, s.Requests, errorCell(s), hitCell(res), fractionCell(res.OfBound, r.Oracle != nil), fractionCell(res.OfIdeal, r.Oracle != nil),
			secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99), secs(s.Latency.P50), secs(s.Latency.P90),
			s.Throughput, s.Goodput, res.PrefillImbalance, res.RequestImbalance)
	}

	r.routerLine(w, "Time per output token after the first, p50 and p90", func(res *RouterResult) (string, bool) {
		t := res.Summary.TPOT
		return fmt.Sprintf("%s %s / %s", res.Router, msecs(t.P50), msecs(t.P90)), t.P90 > 0
	})
	r.routerLine(w, "Disaggregated fleets (pd=P:D: P prefill, D decode replicas): the hit rate above is the prefill replicas' (with local=N, also the decode replicas' on the prompts they computed themselves: kvroute's disaggregation.local_prefill_tokens N), and *of bound* is against the finite-cache bound over P caches (given here); then the prompt tokens whose KV decode replicas received", func(res *RouterResult) (string, bool) {
		return fmt.Sprintf("%s bound %s, %s transferred", res.Router, pct(res.PrefillBound), count(res.TransferTokens)), res.TransferTokens > 0
	})
	r.routerLine(w, "Precision, engine-reported over predicted cached tokens", func(res *RouterResult) (string, bool) {
		return fmt.Sprintf("%s %.3f (%d of %d)", res.Router, res.Precision, res.EngineCached, res.PredictedCached), res.PredictedCached > 0
	})
	r.routerLine(w, "Reuse split: kvroute's account of the engines' prompt tokens (kvroute_reuse_tokens_total): *delivered* (found cached), *routing loss* (another replica was believed to hold them: given up for load), *index loss* (believed held by the chosen replica, not delivered), *workload miss* (held nowhere, as far as kvroute knew)", func(res *RouterResult) (string, bool) {
		return reuseCell(res), len(res.Reuse) > 0
	})
	r.routerLine(w, "Pinned: the share of the replicas' GPU cache that running requests held, time-weighted (no prefix stays cached there; the bound above assumes none), and the finite-cache bound over caches that much smaller, with each router's hits as a fraction of it", func(res *RouterResult) (string, bool) {
		if res.PinnedBound == nil {
			return "", false
		}
		return fmt.Sprintf("%s %s (bound %s, %.3f of it)", res.Router, pct(res.PinnedShare), pct(res.PinnedBound.HitRate), res.OfPinnedBound), true
	})
	r.routerLine(w, "Own placement: each router's placement (the replica that answered each request) replayed over the bound's caches, which only placement fills, as a fraction of the bound's hits", func(res *RouterResult) (string, bool) {
		if res.OwnPlacement == nil {
			return "", false
		}
		return fmt.Sprintf("%s %.3f (hit rate %s, prefill max/mean %.2f)", res.Router, res.OwnPlacementOfBound, pct(res.OwnPlacement.HitRate), res.OwnPlacement.PrefillImbalance), true
	})
	r.routerLine(w, "Held at arrival: the prompt tokens each request's replica held when it arrived, as a fraction of the most any replica held then (1 − it is what the choices gave up of the replicas' own caches, pinned blocks and all: on purpose, a prefix replicated or a turn moved off a loaded replica, or for want of knowing it)", func(res *RouterResult) (string, bool) {
		return fmt.Sprintf("%s %.3f (%d of %d tokens)", res.Router, res.HeldOfBest, res.ArrivalHeldTokens, res.ArrivalBestTokens), res.ArrivalBestTokens > 0
	})
	r.preciseMarkdown(w)
	r.routesMarkdown(w)
	r.noisyMarkdown(w)

	if len(r.Results) > 0 && len(r.Results[0].Replicas) > 0 {
		w("\nShare of requests / of prefill tokens per replica:\n\n| router |")
		for _, rp := range r.Results[0].Replicas {
			w(" %s |", rp.Name)
		}
		w("\n| --- |%s\n", strings.Repeat(" ---: |", len(r.Results[0].Replicas)))
		for i := range r.Results {
			res := &r.Results[i]
			if len(res.Replicas) == 0 {
				continue
			}
			w("| %s |", res.Router)
			for _, rp := range res.Replicas {
				w(" %.0f%% / %.0f%% |", 100*rp.RequestShare, 100*rp.PrefillShare)
			}
			w("\n")
		}
	}
	writeNotes(&b, r.Notes)
	return b.String()
}

// targetMarkdown renders a RunURL report: the setup, one row for the
// endpoint and, when it named its replicas, each one's share of requests.
func (r *Report) targetMarkdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## kvroute bench: %s against %s\n\n", r.Workload, r.Target)
	model := r.Model
	if model == "" {
		model = "not set"
	}
	w("%d requests (%s prompt tokens) to %s (model %s), in real time, rate scale %g; load generated on %s.\n\n",
		r.Requests, count(r.PromptTokens), r.Target, model, r.RateScale, r.Host)
	if o := r.Oracle; o != nil && o.Pooled != nil {
		w("In the engines' tokens (each request as sent, rendered by the fleet's renderer; blocks of %d tokens, prompts only): ideal (one server, infinite cache) **%s**; pooled bound (one LRU cache of all %d replicas' %s tokens each) **%s**; finite-cache bound (each request on the replica holding its longest cached prefix within %g× the mean prefill work) **%s**, prefill max/mean %.2f. ",
			r.BlockSize, pct(o.Ideal.HitRate), r.Replicas, count(o.CapacityTokens), pct(o.Pooled.HitRate), o.LoadCap, pct(o.Bound.HitRate), o.Bound.PrefillImbalance)
	} else {
		w("Ideal prefix-cache hit rate (one server, infinite cache): **%s**. ", pct(r.IdealHitRate))
	}
	w("Times are measured seconds. *Hit rate* is what the endpoint reported: cached prompt tokens (usage.prompt_tokens_details.cached_tokens) over prompt tokens, – when it reported none; ")
	w("*goodput* is successful requests per second with TTFT ≤ %s.\n\n", secs(r.TTFTTarget))
	w("| target | ok | errors | hit rate | TTFT p50 | TTFT p90 | TTFT p99 | latency p50 | latency p90 | throughput | goodput |\n")
	w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i := range r.Results {
		res := &r.Results[i]
		s := &res.Summary
		hit := "–"
		if s.CachedReported > 0 {
			hit = pct(s.ReportedHitRate)
		}
		w("| %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %.2f/s | %.2f/s |\n",
			res.Router, s.OK, s.Requests, errorCell(s), hit,
			secs(s.TTFT.P50), secs(s.TTFT.P90), secs(s.TTFT.P99), secs(s.Latency.P50), secs(s.Latency.P90),
			s.Throughput, s.Goodput)
	}
	if o := r.Oracle; o != nil && o.Pooled != nil {
		r.routerLine(w, "Reported hit tokens as a fraction of the pooled bound's, the finite-cache bound's and the ideal's", func(res *RouterResult) (string, bool) {
			return fmt.Sprintf("%s %.3f, %.3f, %.3f", res.Router, res.OfPooled, res.OfBound, res.OfIdeal), true
		})
	}
	r.routerLine(w, "Reuse split, kvroute's account of the engines' prompt tokens over the run (kvroute_reuse_tokens_total from --admin-url)", func(res *RouterResult) (string, bool) {
		return reuseCell(res), len(res.Reuse) > 0
	})
	for i := range r.Results {
		res := &r.Results[i]
		if len(res.Replicas) == 0 {
			continue
		}
		w("\nShare of requests per replica (X-Kvroute-Backend), max/mean %.2f:\n\n|", res.RequestImbalance)
		for _, rp := range res.Replicas {
			w(" %s |", rp.Name)
		}
		w("\n|%s\n|", strings.Repeat(" ---: |", len(res.Replicas)))
		for _, rp := range res.Replicas {
			w(" %.0f%% |", 100*rp.RequestShare)
		}
		w("\n")
	}
	r.noisyMarkdown(w)
	writeNotes(&b, r.Notes)
	return b.String()
}

// writeNotes ends a Markdown report with its notes, as a list under
// "Notes:"; nothing when there are none.
func writeNotes(b *strings.Builder, notes []string) {
	if len(notes) == 0 {
		return
	}
	b.WriteString("\nNotes:\n\n")
	for _, n := range notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
}

// errorCell renders the error count with its kinds, and the requests not
// sent when the run was cut short.
func errorCell(s *load.Summary) string {
	cell := fmt.Sprint(s.Errors)
	if s.Errors > 0 {
		cell += " (" + sortedKinds(s.ErrorsByKind) + ")"
	}
	if s.NotSent > 0 {
		cell += fmt.Sprintf(", %d not sent", s.NotSent)
	}
	return cell
}

// fractionCell renders a fraction to three places, "–" when it is not
// known (no oracle, no predicted cached tokens, no replica named).
func fractionCell(f float64, known bool) string {
	if !known {
		return "–"
	}
	return fmt.Sprintf("%.3f", f)
}

// pct renders a fraction as a percentage.
func pct(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

// secs renders seconds readably: milliseconds below one second.
func secs(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 0.001:
		return fmt.Sprintf("%.2f ms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 100:
		return fmt.Sprintf("%.2f s", s)
	}
	return fmt.Sprintf("%.0f s", s)
}

// msecs renders seconds as milliseconds to a tenth.
func msecs(s float64) string { return fmt.Sprintf("%.1f ms", s*1000) }

// count renders a large count compactly (12.3M).
func count(n int64) string {
	switch {
	case n >= 10_000_000:
		return fmt.Sprintf("%.0fM", float64(n)/1e6)
	case n >= 1_000_000:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 10_000:
		return fmt.Sprintf("%.0fk", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}

// sortedKinds returns "n kind, ..." for an error breakdown.
func sortedKinds(m map[string]int) string {
	kinds := make([]string, 0, len(m))
	for k := range m {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}

// hostTier reports whether any replica of the run reused prefixes from a
// host-memory tier.
func (r *Report) hostTier() bool {
	for i := range r.Results {
		if r.Results[i].HostHitTokens > 0 {
			return true
		}
	}
	return false
}

// hitCell renders a router's hit rate, with the host tier's part when it
// had one.
func hitCell(res *RouterResult) string {
	if res.HostHitTokens == 0 {
		return pct(res.HitRate)
	}
	return pct(res.HitRate) + " (" + pct(ratio(res.HostHitTokens, res.QueryTokens)) + ")"
}

// routerLine writes "intro: cells." on a line of its own, one cell per
// router that cell gives one for; nothing when it gives none.
func (r *Report) routerLine(w func(string, ...any), intro string, cell func(res *RouterResult) (string, bool)) {
	var cells []string
	for i := range r.Results {
		if c, ok := cell(&r.Results[i]); ok {
			cells = append(cells, c)
		}
	}
	if len(cells) > 0 {
		w("\n%s: %s.\n", intro, strings.Join(cells, ", "))
	}
}

// reuseCell is a router's reuse split as shares of the prompt tokens.
func reuseCell(res *RouterResult) string {
	var total int64
	for _, n := range res.Reuse {
		total += n
	}
	share := func(kind string) string {
		if total == 0 {
			return "0 %"
		}
		return pct(float64(res.Reuse[kind]) / float64(total))
	}
	return fmt.Sprintf("%s delivered %s, routing loss %s, index loss %s, workload miss %s", res.Router,
		share("delivered"), share("routing_loss"), share("index_loss"), share("workload_miss"))
}
