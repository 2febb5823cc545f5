package runner

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/bench/load"
)

func TestRouteCounts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes []string
		want   []RouteCount
	}{
		{name: "no routes (nginx)", routes: []string{"", ""}, want: nil},
		{
			name:   "kinds by requests, then name; matched summed",
			routes: []string{"cache_hit matched=512", "cold least_load", "cache_hit matched=1024 precise", "", "overflow matched=16", "cold least_load", "session"},
			want: []RouteCount{
				{Kind: "cache_hit", Requests: 2, Matched: 1536},
				{Kind: "cold", Requests: 2},
				{Kind: "overflow", Requests: 1, Matched: 16},
				{Kind: "session", Requests: 1},
			},
		},
		{name: "a malformed count adds nothing", routes: []string{"spread matched=x", "spread matched=-3", "spread matched="}, want: []RouteCount{{Kind: "spread", Requests: 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			samples := make([]load.Sample, len(tc.routes))
			for i, r := range tc.routes {
				samples[i].Route = r
			}
			if got := routeCounts(samples); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRoutesMarkdown(t *testing.T) {
	r := &Report{Results: []RouterResult{
		{Router: "nginx/round_robin"},
		{Router: "kvroute/cache_aware", Routes: []RouteCount{{Kind: "cache_hit", Requests: 3, Matched: 3 * 4096}, {Kind: "cold", Requests: 1}}},
	}}
	var b strings.Builder
	r.routesMarkdown(func(format string, args ...any) { fmt.Fprintf(&b, format, args...) })
	got := b.String()
	if want := "- kvroute/cache_aware: cache_hit 75.0 % (4096 tokens matched on average), cold 25.0 %"; !strings.Contains(got, want) {
		t.Errorf("got %q, want a line %q", got, want)
	}
	if strings.Contains(got, "nginx") {
		t.Errorf("a router without routes is listed: %q", got)
	}
}
