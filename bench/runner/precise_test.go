package runner

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvroute/kvroute/bench/sim"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// kvroute in precise mode over a fleet publishing its KV events: named
// alone it runs right after the approximate cache_aware, which is added
// for it, each on its own fleet; both serve every request, the precise one
// routes some of them on exact tokens, renders them on replica 0 and
// follows both replicas, and the report and its files say so. So it goes
// with kvroute in the benchmark's process, and with each kvroute in a
// process of its own (this test binary serving kvroute), whose figures
// are read from its /metrics.
func TestPreciseEndToEnd(t *testing.T) {
	for _, process := range []bool{false, true} {
		t.Run(fmt.Sprintf("process=%v", process), func(t *testing.T) {
			o := tinyOptions(t, "cache_aware+precise")
			if process {
				o.KvrouteCommand = []string{os.Args[0], serveArg}
			}
			checkPreciseRun(t, o, process)
		})
	}
}

// checkPreciseRun runs o (cache_aware+precise) and checks its report; with
// process, that each kvroute ran as its own process.
func checkPreciseRun(t *testing.T, o Options, process bool) {
	t.Helper()
	rep := runWithin(t, o, 60*time.Second)
	names := make([]string, 0, len(rep.Results))
	for _, res := range rep.Results {
		names = append(names, res.Router)
	}
	if want := []string{"kvroute/cache_aware", NamePrecise}; !slices.Equal(names, want) {
		t.Fatalf("routers %v, want %v", names, want)
	}
	for _, res := range rep.Results {
		s := res.Summary
		if res.Error != "" || s.OK != 30 || s.Errors != 0 {
			t.Errorf("%s: error %q, %d/%d ok, errors %v", res.Router, res.Error, s.OK, s.Requests, s.ErrorsByKind)
		}
		if res.PredictedCached <= 0 || res.Precision <= 0 {
			t.Errorf("%s: predicted %d cached tokens, precision %.3f", res.Router, res.PredictedCached, res.Precision)
		}
	}
	if p := rep.Results[0].Precise; p != nil {
		t.Errorf("approximate cache_aware has precise figures %+v", p)
	}
	p := rep.Results[1].Precise
	if p == nil {
		t.Fatal("precise kvroute has no precise figures")
	}
	if p.Decisions != 30 || p.PreciseDecisions == 0 || p.PreciseDecisions > p.Decisions || p.Share <= 0 {
		t.Errorf("%d of %d decisions precise (share %.3f), want some of all 30", p.PreciseDecisions, p.Decisions, p.Share)
	}
	// The precise decisions' own cached tokens are a part of the router's.
	if p.PrecisePredicted <= 0 || p.PrecisePredicted > rep.Results[1].PredictedCached || p.PreciseEngineCached > rep.Results[1].EngineCached ||
		p.PrecisePrecision != ratio(p.PreciseEngineCached, p.PrecisePredicted) {
		t.Errorf("precise decisions: predicted %d engine %d precision %.3f, of the router's predicted %d engine %d",
			p.PrecisePredicted, p.PreciseEngineCached, p.PrecisePrecision, rep.Results[1].PredictedCached, rep.Results[1].EngineCached)
	}
	if total(p.Renders) == 0 || p.RenderP99 <= 0 {
		t.Errorf("renders %v, render p99 %v s", p.Renders, p.RenderP99)
	}
	if p.Followed != 2 || p.PreciseReplicas == 0 {
		t.Errorf("%d replicas followed, %d precise, want 2 followed and some precise", p.Followed, p.PreciseReplicas)
	}

	md := rep.Markdown()
	for _, want := range []string{"precise decisions", "| " + NamePrecise + " | ", "| kvroute/cache_aware | "} {
		if strings.Count(md, want) < 1 {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if cell := fmt.Sprintf("(%d/%d) |", p.PreciseDecisions, p.Decisions); !strings.Contains(md, cell) {
		t.Errorf("report lacks the precise decisions %q:\n%s", cell, md)
	}
	var back Report
	if js, err := os.ReadFile(filepath.Join(o.Out, FileJSON)); err != nil || json.Unmarshal(js, &back) != nil || len(back.Results) != 2 ||
		back.Results[1].Precise == nil || back.Results[1].Precise.PreciseDecisions != p.PreciseDecisions {
		t.Errorf("results.json: %v, %+v", err, back.Results)
	}
	yaml, err := os.ReadFile(filepath.Join(o.Out, "routers", "kvroute_cache_aware+precise", "kvroute.yaml"))
	if err != nil || !strings.Contains(string(yaml), "kv_events:") || !strings.Contains(string(yaml), "render_url:") ||
		!strings.Contains(string(yaml), "render_timeout: 20ms") {
		t.Errorf("kept configuration lacks kv_events, render_url or render_timeout (%v):\n%s", err, yaml)
	}
	for _, dir := range []string{"kvroute_cache_aware", "kvroute_cache_aware+precise"} {
		_, err := os.Stat(filepath.Join(o.Out, "routers", dir, FileKvrouteProcessConfig))
		if process != (err == nil) {
			t.Errorf("%s: process %v, but %s: %v", dir, process, FileKvrouteProcessConfig, err)
		}
	}
	t.Log("\n" + md)
}

// Options.Precise adds the precise kvroute beside cache_aware, also to
// every router; naming it pairs it with cache_aware; "all" and "kvroute"
// leave it out; a precise kvroute cannot start without its fleet, nor run
// as instances.
func TestPreciseRouterNames(t *testing.T) {
	missing := "/nonexistent/bin/x"
	names := func(in []string, precise bool) []string {
		o := Options{Routers: in, Precise: precise}
		rs, _, err := ResolveRouters(o.routerNames(), true, missing, missing)
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		out := make([]string, 0, len(rs))
		for _, r := range rs {
			out = append(out, r.Name())
		}
		return out
	}
	for _, tt := range []struct {
		in      []string
		precise bool
		want    []string
	}{
		{in: []string{"round_robin", "cache_aware"}, precise: true, want: []string{"kvroute/round_robin", "kvroute/cache_aware", NamePrecise}},
		{in: []string{"round_robin"}, precise: true, want: []string{"kvroute/round_robin", "kvroute/cache_aware", NamePrecise}},
		{in: []string{NamePrecise, "round_robin", "cache_aware"}, want: []string{"kvroute/round_robin", "kvroute/cache_aware", NamePrecise}},
		{in: nil, precise: true, want: []string{"kvroute/cache_aware", NamePrecise, "kvroute/session", "kvroute/least_load", "kvroute/round_robin"}},
		{in: []string{"kvroute"}, want: []string{"kvroute/cache_aware", "kvroute/session", "kvroute/least_load", "kvroute/round_robin"}},
	} {
		if got := names(tt.in, tt.precise); !slices.Equal(got, tt.want) {
			t.Errorf("%q precise %v: %v, want %v", tt.in, tt.precise, got, tt.want)
		}
	}
	k := &Kvroute{Policy: "cache_aware", Precise: true}
	if _, err := k.Start(context.Background(), []string{"http://127.0.0.1:1"}, t.TempDir()); err == nil {
		t.Error("a precise kvroute started without a fleet publishing KV events")
	}
	o := DefaultOptions()
	o.Instances, o.Precise = []int{1, 2}, true
	if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "precise") {
		t.Errorf("precise with instances: %v", err)
	}
	o = DefaultOptions()
	o.Instances, o.Routers = []int{1}, []string{"cache_aware+precise"}
	if _, err := instancesPolicy(&o, false); err == nil {
		t.Error("instances took the precise kvroute's policy")
	}
}

// The family's precise table lists the routers that predict, the precise
// one with its figures, and is left out when no precise kvroute ran.
func TestFamilyPreciseMarkdown(t *testing.T) {
	p := &PreciseResult{Decisions: 40, PreciseDecisions: 30, Share: 0.75, PrecisePredicted: 80, PreciseEngineCached: 72, PrecisePrecision: 0.9, Renders: map[string]uint64{"rendered": 35},
		Fallbacks: map[string]uint64{"timeout": 5, "error": 0}, RenderP99: 0.004, Gaps: 1, Replays: 1, Followed: 2, PreciseReplicas: 2}
	rep := &FamilyReport{Shapes: []FamilyShape{{Shape: ShapeRAG, Rows: []FamilyRow{
		{Router: "kvroute/cache_aware", PredictedCached: 100, Precision: 1.02},
		{Router: NamePrecise, PredictedCached: 90, Precision: 0.99, Precise: p},
		{Router: "kvroute/round_robin"},
	}}}}
	md := rep.Markdown()
	for _, want := range []string{
		"| rag | kvroute/cache_aware | 1.020 | – | – | – | – | – | – | – |\n",
		"| rag | " + NamePrecise + " | 0.990 | 75.0 % (30/40) | 0.900 | 35 (35 rendered) | 5 (5 timeout) | 4.00 ms | 1 / 1 / 0 | 2/2 |\n",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("family report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| rag | kvroute/round_robin | –") {
		t.Errorf("round_robin, which predicts nothing, is in the precise table:\n%s", md)
	}
	rep.Shapes[0].Rows = rep.Shapes[0].Rows[:1]
	if md := rep.Markdown(); strings.Contains(md, "Precise mode") {
		t.Errorf("precise table without a precise kvroute:\n%s", md)
	}
}

// Cutting every replica's event stream a third of the way through the run
// and restoring it two thirds of the way loses no request: kvroute sees
// the gap, replays it, and keeps routing precisely; the report says when
// the streams were cut.
func TestPreciseEventsCutMidRun(t *testing.T) {
	o := tinyOptions(t, NamePrecise)
	o.PreciseCutEvents = []float64{0.3, 0.6}
	rep := runWithin(t, o, 60*time.Second)
	for _, res := range rep.Results {
		if s := res.Summary; res.Error != "" || s.OK != 30 || s.Errors != 0 {
			t.Errorf("%s: error %q, %d/%d ok, errors %v", res.Router, res.Error, s.OK, s.Requests, s.ErrorsByKind)
		}
	}
	p := rep.Results[len(rep.Results)-1].Precise
	if p == nil {
		t.Fatal("no precise figures")
	}
	if p.EventsCutAfter != 9 || p.EventsRestoredAfter != 18 {
		t.Errorf("events cut after %d and restored after %d requests, want 9 and 18", p.EventsCutAfter, p.EventsRestoredAfter)
	}
	if p.Gaps == 0 || p.Replays == 0 || p.PreciseDecisions == 0 {
		t.Errorf("%d gaps, %d replays, %d precise decisions: want the cut seen and replayed, and routing precise", p.Gaps, p.Replays, p.PreciseDecisions)
	}
	if md := rep.Markdown(); !strings.Contains(md, "cut once 9 requests had completed, and restored once 18 had") {
		t.Errorf("report does not say when the events were cut:\n%s", md)
	}
	o.PreciseCutEvents = []float64{0.6, 0.3}
	if _, err := Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "cut") {
		t.Errorf("a restore before the cut: %v", err)
	}
}

// fleetConfig: a precise kvroute's replicas publish KV events, and so do
// every other router's in a run that has one, so that the routers compared
// are served by engines doing the same work.
func TestFleetConfigPublishes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		r       Router
		publish bool
		want    bool
	}{
		{"precise", &Kvroute{Precise: true}, false, true},
		{"approximate alone", &Kvroute{}, false, false},
		{"approximate beside precise", &Kvroute{}, true, true},
	} {
		cfg := fleetConfig(tc.r, sim.Config{KVEventsPort: 7}, tc.publish)
		if cfg.KVEvents != tc.want || tc.want && (cfg.KVEventsEncoding != "tagged" || cfg.KVEventsPort != 0) {
			t.Errorf("%s: events %v (encoding %q, port %d), want %v", tc.name, cfg.KVEvents, cfg.KVEventsEncoding, cfg.KVEventsPort, tc.want)
		}
	}
}
