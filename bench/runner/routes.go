package runner

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/telemetry"
)

// RouteCount is one kind of routing decision of a kvroute router: the
// first word of the X-Kvroute-Route its answers carried ("cache_hit",
// "spread", "overflow", "cold", "session", ...), how many answers carried
// it and the prefix tokens those decisions expected cached (the route's
// matched=N, summed).
type RouteCount struct {
	Kind     string `json:"kind"`
	Requests int    `json:"requests"`
	Matched  int64  `json:"matched_tokens"`
}

// routeCounts tallies the samples' routes by kind, most requests first
// (then by kind); nil when no answer carried a route (a router other than
// kvroute).
func routeCounts(samples []load.Sample) []RouteCount {
	by := map[string]*RouteCount{}
	for i := range samples {
		route := samples[i].Route
		if route == "" {
			continue
		}
		kind := telemetry.RouteLabel(route)
		c := by[kind]
		if c == nil {
			c = &RouteCount{Kind: kind}
			by[kind] = c
		}
		c.Requests++
		c.Matched += routeMatched(route)
	}
	if len(by) == 0 {
		return nil
	}
	out := make([]RouteCount, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b RouteCount) int {
		return cmp.Or(cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.Kind, b.Kind))
	})
	return out
}

// routeMatched is the N of a route's "matched=N", 0 without one.
func routeMatched(route string) int64 {
	_, rest, ok := strings.Cut(route, "matched=")
	if !ok {
		return 0
	}
	if i := strings.IndexByte(rest, ' '); i >= 0 {
		rest = rest[:i]
	}
	n, err := strconv.ParseInt(rest, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// routesMarkdown renders, for every router whose answers carried routes,
// its decisions by kind: share of its answers and mean expected cached
// tokens.
func (r *Report) routesMarkdown(w func(format string, args ...any)) {
	var lines []string
	for i := range r.Results {
		res := &r.Results[i]
		total := 0
		for _, c := range res.Routes {
			total += c.Requests
		}
		if total == 0 {
			continue
		}
		parts := make([]string, 0, len(res.Routes))
		for _, c := range res.Routes {
			part := fmt.Sprintf("%s %s", c.Kind, pct(float64(c.Requests)/float64(total)))
			if c.Matched > 0 {
				part += fmt.Sprintf(" (%s tokens matched on average)", count(c.Matched/int64(c.Requests)))
			}
			parts = append(parts, part)
		}
		lines = append(lines, fmt.Sprintf("- %s: %s", res.Router, strings.Join(parts, ", ")))
	}
	if len(lines) == 0 {
		return
	}
	w("\nDecisions by kind (the first word of X-Kvroute-Route: *cache_hit* the best holder of the prefix, *spread* a new branch sent to another replica, *overflow* a holder passed over for its load, *cold* no prefix worth keeping, *session* the session's replica, *decode_local* a decode replica that computes a prompt it holds all but a few tokens of, *decode_backlog* one that computes a prompt while the prefill replicas are behind), as a share of each router's answers:\n\n%s\n", strings.Join(lines, "\n"))
}
