package runner

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// runWithin runs the benchmark o, failing t on an error or when it takes
// longer than d.
func runWithin(t *testing.T, o Options, d time.Duration) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// tinyOptions is a 30-request multi-turn benchmark on 2 replicas at a very
// fast time scale: 6 users × 5 turns sharing 2 system prompts, spread out
// enough that few requests overlap (so that load bounds rarely override
// affinity) and with histories long enough that following the session
// matters.
func tinyOptions(t *testing.T, routers ...string) Options {
	o := DefaultOptions()
	o.Workload = "multiturn"
	o.MultiTurn = load.MultiTurnOptions{Users: 6, Turns: 5, SystemPrompts: 2, SystemTokens: 300, UserTokens: 200,
		AnswerTokens: 100, Think: 3 * time.Second, Duration: 15 * time.Second, Seed: 3}
	o.Limit = 30
	o.Replicas = 2
	o.TimeScale = 0.02
	o.Routers = routers
	o.Out = t.TempDir()
	return o
}

func installed(name string) bool {
	_, err := FindBinary("", name)
	return err == nil
}

func TestBenchEndToEnd(t *testing.T) {
	routers := []string{"round_robin", "cache_aware"}
	if installed("nginx") {
		routers = append(routers, "nginx")
	}
	o := tinyOptions(t, routers...)
	rep := runWithin(t, o, 45*time.Second)
	if len(rep.Results) != len(routers) {
		t.Fatalf("got %d results, want %d", len(rep.Results), len(routers))
	}
	byName := map[string]*RouterResult{}
	for i := range rep.Results {
		res := &rep.Results[i]
		byName[res.Router] = res
		s := res.Summary
		if res.Error != "" || s.Requests != 30 || s.OK != 30 || s.Errors != 0 {
			t.Errorf("%s: error %q, %d/%d ok, errors %v", res.Router, res.Error, s.OK, s.Requests, s.ErrorsByKind)
		}
		var reqs int64
		for _, rp := range res.Replicas {
			reqs += rp.Requests
		}
		if reqs != 30 || len(res.Replicas) != 2 {
			t.Errorf("%s: replicas counted %d requests over %d replicas, want 30 over 2", res.Router, reqs, len(res.Replicas))
		}
		if res.HitRate <= 0 || res.HitRate > rep.IdealHitRate+1e-9 {
			t.Errorf("%s: hit rate %.3f outside (0, ideal %.3f]", res.Router, res.HitRate, rep.IdealHitRate)
		}
		if len(res.TTFTCDF) == 0 || s.TTFT.P90 <= 0 {
			t.Errorf("%s: no TTFT", res.Router)
		}
	}
	checkOracle(t, rep)
	ca, rr := byName["kvroute/cache_aware"], byName["kvroute/round_robin"]
	if ca == nil || rr == nil {
		t.Fatalf("missing results: %v", slices.Collect(mapKeys(byName)))
	}
	if ca.HitRate < rr.HitRate {
		t.Errorf("cache_aware hit rate %.3f < round_robin %.3f", ca.HitRate, rr.HitRate)
	}
	// The simulator reports cached tokens; cache_aware predicts them. Its
	// answers are cached too, which kvroute does not predict: precision
	// may exceed 1 on multi-turn work, but not by much.
	if ca.PredictedCached <= 0 || ca.Precision < 0.5 || ca.Precision > 1.5 {
		t.Errorf("cache_aware precision %.3f (%d of %d predicted), want reported and near 1", ca.Precision, ca.EngineCached, ca.PredictedCached)
	}
	if !strings.Contains(rep.Markdown(), "Precision, engine-reported over predicted cached tokens: kvroute/cache_aware") {
		t.Error("the report does not show cache_aware's precision")
	}
	t.Logf("ideal %.3f, cache_aware %.3f, round_robin %.3f", rep.IdealHitRate, ca.HitRate, rr.HitRate)

	md, back := readReport(t, o.Out)
	for _, r := range routers {
		if !strings.Contains(md, r) {
			t.Errorf("results.md lacks %s:\n%s", r, md)
		}
	}
	if len(back.Results) != len(routers) || back.Results[0].Summary.OK != 30 {
		t.Errorf("results.json round trip: %+v", back.Results)
	}
	svg, err := os.ReadFile(filepath.Join(o.Out, FileSVG))
	if err != nil {
		t.Fatal(err)
	}
	checkSVG(t, svg, len(routers))
	// The routers' configurations are kept beside the results.
	if _, err := os.Stat(filepath.Join(o.Out, "routers", "kvroute_cache_aware", "kvroute.yaml")); err != nil {
		t.Error(err)
	}
}

func mapKeys(m map[string]*RouterResult) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// checkSVG parses svg as XML and counts its CDF lines.
func checkSVG(t *testing.T, svg []byte, lines int) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	polylines := 0
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("results.svg is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
			}
			if se.Name.Local == "polyline" {
				polylines++
			}
		}
	}
	if root != "svg" || polylines != lines {
		t.Errorf("svg root %q with %d polylines, want svg with %d", root, polylines, lines)
	}
}

func TestRouterConfigsValidate(t *testing.T) {
	backends := []string{"http://127.0.0.1:18001", "http://127.0.0.1:18002", "http://127.0.0.1:18003"}
	t.Run("nginx", func(t *testing.T) {
		bin, err := FindBinary("", "nginx")
		if err != nil {
			t.Skip(err)
		}
		if err := (&Nginx{Binary: bin}).Check(t.TempDir(), backends); err != nil {
			t.Fatal(err)
		}
	})
	for _, hash := range []bool{false, true} {
		t.Run("haproxy", func(t *testing.T) {
			bin, err := FindBinary("", "haproxy")
			if err != nil {
				t.Skip(err)
			}
			if err := (&HAProxy{Binary: bin, HashSession: hash}).Check(t.TempDir(), backends); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("generated", func(t *testing.T) {
		conf, err := NginxConfig("/tmp/x", 8080, backends, true, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"user root;", "server 127.0.0.1:18003", "keepalive 1024;", "proxy_buffering off;", `proxy_set_header Connection "";`} {
			if !strings.Contains(conf, want) {
				t.Errorf("nginx.conf lacks %q", want)
			}
		}
		hc, err := HAProxyConfig(8080, backends, true)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"balance hdr(X-Session-ID)", "hash-type consistent", "hash-balance-factor 125", "server sim-2 127.0.0.1:18003"} {
			if !strings.Contains(hc, want) {
				t.Errorf("haproxy.cfg lacks %q", want)
			}
		}
		for log, want := range map[bool]string{true: "access_log /tmp/x/access.log combined;", false: "access_log off;"} {
			conf, err := NginxConfig("/tmp/x", 8080, backends, false, log)
			if err != nil || !strings.Contains(conf, want) {
				t.Errorf("access log %v: nginx.conf lacks %q (%v)", log, want, err)
			}
		}
		if _, err := NginxConfig("/tmp/x", 8080, []string{"::bad"}, false, false); err == nil {
			t.Error("bad backend URL accepted")
		}
	})
}

// TestHAProxyStarts runs HAProxy in front of a tiny fleet (nginx runs in
// the end-to-end test).
func TestHAProxyStarts(t *testing.T) {
	if !installed("haproxy") {
		t.Skip("haproxy is not installed")
	}
	o := tinyOptions(t, "haproxy")
	o.Limit = 10
	o.Out = ""
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 {
		t.Fatalf("want leastconn and hdr_hash, got %d results", len(rep.Results))
	}
	for _, res := range rep.Results {
		if res.Error != "" || res.Summary.OK != 10 {
			t.Errorf("%s: %q, %d ok", res.Router, res.Error, res.Summary.OK)
		}
	}
}

func TestResolveRouters(t *testing.T) {
	names := func(rs []Router) []string {
		out := make([]string, 0, len(rs))
		for _, r := range rs {
			out = append(out, r.Name())
		}
		return out
	}
	missing := "/nonexistent/bin/x"
	tests := []struct {
		in       []string
		sessions bool
		want     []string
		notes    int
		err      bool
	}{
		{in: nil, sessions: true, want: []string{"kvroute/cache_aware", "kvroute/session", "kvroute/least_load", "kvroute/round_robin"}, notes: 3},
		{in: []string{"round_robin", "kvroute/cache_aware", "round_robin"}, want: []string{"kvroute/round_robin", "kvroute/cache_aware"}},
		{in: []string{"kvroute", "haproxy"}, want: []string{"kvroute/cache_aware", "kvroute/session", "kvroute/least_load", "kvroute/round_robin"}, notes: 2},
		{in: []string{"nginx"}, err: true},
		{in: []string{"cache_aware", "hdr_hash"}, err: true},
		{in: []string{"bogus"}, err: true},
		{in: []string{""}, err: true},
	}
	for _, tt := range tests {
		rs, notes, err := ResolveRouters(tt.in, tt.sessions, missing, missing)
		if (err != nil) != tt.err {
			t.Errorf("%q: err %v, want error %v", tt.in, err, tt.err)
			continue
		}
		if err != nil {
			continue
		}
		if got := names(rs); !slices.Equal(got, tt.want) || len(notes) != tt.notes {
			t.Errorf("%q: got %v with notes %q, want %v with %d notes", tt.in, got, notes, tt.want, tt.notes)
		}
	}
	if installed("haproxy") {
		rs, notes, err := ResolveRouters([]string{"haproxy"}, false, "", "")
		if err != nil || !slices.Equal(names(rs), []string{NameHAProxy}) || len(notes) != 1 {
			t.Errorf("haproxy without sessions: %v %q %v", names(rs), notes, err)
		}
	}
}

func TestBuildWorkloadScales(t *testing.T) {
	o := DefaultOptions()
	o.TimeScale = 0.1
	o.RateScale = 2
	o.MultiTurn = load.MultiTurnOptions{Users: 3, Turns: 2, Think: 10 * time.Second, Duration: 100 * time.Second, Seed: 1}
	w, err := BuildWorkload(o)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range w.Requests {
		if r.DependsOn >= 0 && r.Think != time.Second {
			t.Errorf("think %v, want 1s (10s × time scale 0.1)", r.Think)
		}
		if r.DependsOn < 0 && r.At >= 5*time.Second {
			t.Errorf("first turn at %v, want within 100s × 0.1 / 2 = 5s", r.At)
		}
	}
	o.Workload = "hotprefix"
	o.Limit = 7
	if w, err = BuildWorkload(o); err != nil || len(w.Requests) != 7 {
		t.Fatalf("hotprefix limit: %v, %v", err, w)
	}
	o.Workload = "mooncake"
	for _, path := range []string{"", filepath.Join(t.TempDir(), "none.jsonl")} {
		o.Mooncake.TracePath = path
		var te *load.TraceError
		if _, err := BuildWorkload(o); !errors.As(err, &te) || !strings.Contains(err.Error(), load.MooncakeTraceURL) {
			t.Errorf("trace %q: got %v, want a *load.TraceError naming the download URL", path, err)
		}
	}
	o.Workload = "nope"
	if _, err := BuildWorkload(o); err == nil {
		t.Error("unknown workload accepted")
	}
	// A shape of the family is the workload RunFamily builds for it.
	o.Limit, o.Workload = 0, FamilyWorkloadPrefix+ShapeRAG
	f := FamilyOptions{Options: o, Seed: o.MultiTurn.Seed, Scale: 1}
	want, err := f.build(ShapeRAG, &o)
	if err != nil {
		t.Fatal(err)
	}
	if w, err = BuildWorkload(o); err != nil || len(w.Requests) != len(want.Requests) || w.Requests[3].Messages[0] != want.Requests[3].Messages[0] {
		t.Errorf("family:rag: %v, %d requests, want %d", err, len(w.Requests), len(want.Requests))
	}
	o.Workload = FamilyWorkloadPrefix + "nope"
	if _, err := BuildWorkload(o); err == nil || !strings.Contains(err.Error(), "want family: and one of") {
		t.Errorf("family:nope: %v", err)
	}
}

func TestReportRendering(t *testing.T) {
	rep := &Report{Workload: "w<&>", Requests: 3, Replicas: 2, Preset: "p", TimeScale: 1, RateScale: 1, IdealHitRate: 0.5,
		Results: []RouterResult{
			{Router: "a", Summary: load.Summary{Requests: 3, OK: 2, Errors: 1, ErrorsByKind: map[string]int{"http_503": 1}},
				HitRate: 0.25, TTFTCDF: [][2]float64{{0.01, 0.5}, {2.5, 1}},
				Replicas: []ReplicaShare{{Name: "sim-0", RequestShare: 1, PrefillShare: 1}, {Name: "sim-1"}}},
			{Router: "b", Error: "start: boom"},
		},
		Notes: []string{"b: start: boom"}}
	md := rep.Markdown()
	for _, want := range []string{"| a | 2/3 | 1 (1 http_503) | 25.0 %", "| b | – |", "100% / 100%", "- b: start: boom"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	checkSVG(t, []byte(rep.SVG()), 1)
	empty := &Report{Workload: "none"}
	checkSVG(t, []byte(empty.SVG()), 0)
}

// checkPinned checks a router's pinned share and the bound over caches
// less it: every simulated run pins blocks while requests run, and not
// all of them; the pinned bound is over the same prompts, with the
// router's hits over its own, and the Markdown shows it.
func checkPinned(t *testing.T, res *RouterResult, o *Oracle, md string) {
	t.Helper()
	pb := res.PinnedBound
	if res.PinnedShare <= 0 || res.PinnedShare >= 1 || pb == nil || pb.PromptTokens != o.Bound.PromptTokens || pb.HitTokens <= 0 {
		t.Errorf("%s: pinned share %v, bound %+v", res.Router, res.PinnedShare, pb)
		return
	}
	if want := float64(res.HitTokens) / float64(pb.HitTokens); math.Abs(res.OfPinnedBound-want) > 1e-12 {
		t.Errorf("%s: %v of the pinned bound, want %v", res.Router, res.OfPinnedBound, want)
	}
	if cell := fmt.Sprintf("%s %s (bound %s, %.3f of it)", res.Router, pct(res.PinnedShare), pct(pb.HitRate), res.OfPinnedBound); !strings.Contains(md, cell) {
		t.Errorf("%s: markdown lacks %q", res.Router, cell)
	}
}

// checkOwnPlacement checks a router's own placement replayed over the
// bound's caches: kvroute's answers name every replica, so the replay has
// every request where the replicas counted them and the bound's prompts;
// other routers name none and have no replay.
// checkHeld checks the held-at-arrival figure of a run with reuse: a
// replica's hits were held when its request arrived or stored while it
// waited, so the arrivals counted something, no more than the fleet's
// most, and the report shows the ratio.
func checkHeld(t *testing.T, res *RouterResult, md string) {
	t.Helper()
	if res.ArrivalBestTokens <= 0 || res.ArrivalHeldTokens > res.ArrivalBestTokens ||
		math.Abs(res.HeldOfBest-float64(res.ArrivalHeldTokens)/float64(res.ArrivalBestTokens)) > 1e-12 {
		t.Errorf("%s: held %d of %d tokens at arrival (%v)", res.Router, res.ArrivalHeldTokens, res.ArrivalBestTokens, res.HeldOfBest)
		return
	}
	if cell := fmt.Sprintf("%s %.3f (%d of %d tokens)", res.Router, res.HeldOfBest, res.ArrivalHeldTokens, res.ArrivalBestTokens); !strings.Contains(md, "Held at arrival") || !strings.Contains(md, cell) {
		t.Errorf("%s: markdown lacks the held-at-arrival figure %q", res.Router, cell)
	}
}

func checkOwnPlacement(t *testing.T, res *RouterResult, o *Oracle, md string) {
	t.Helper()
	p := res.OwnPlacement
	if !strings.HasPrefix(res.Router, "kvroute/") {
		if p != nil {
			t.Errorf("%s: own placement %+v from a router that names no replica", res.Router, p)
		}
		return
	}
	if p == nil || res.placed != len(res.placement) || p.PromptTokens != o.Bound.PromptTokens || p.HitTokens > o.Ideal.HitTokens {
		t.Errorf("%s: own placement %+v, %d of %d requests placed", res.Router, p, res.placed, len(res.placement))
		return
	}
	counts := make([]int64, len(res.Replicas))
	for _, k := range res.placement {
		counts[k]++
	}
	for k, rp := range res.Replicas {
		if counts[k] != rp.Requests {
			t.Errorf("%s: %d requests placed on %s, it counted %d", res.Router, counts[k], rp.Name, rp.Requests)
		}
	}
	if want := float64(p.HitTokens) / float64(o.Bound.HitTokens); math.Abs(res.OwnPlacementOfBound-want) > 1e-12 {
		t.Errorf("%s: own placement %v of the bound, want %v", res.Router, res.OwnPlacementOfBound, want)
	}
	if cell := fmt.Sprintf("%s %.3f (hit rate %s", res.Router, res.OwnPlacementOfBound, pct(p.HitRate)); !strings.Contains(md, cell) {
		t.Errorf("%s: markdown lacks %q", res.Router, cell)
	}
}

// checkOracle checks a report's oracle: the ideal is the report's ideal
// hit rate, the bound is at most the ideal, each router's fractions are its
// hit tokens over theirs, and the Markdown shows them.
func checkOracle(t *testing.T, rep *Report) {
	t.Helper()
	o := rep.Oracle
	if o == nil {
		t.Fatal("no oracle in the report")
	}
	if math.Abs(o.Ideal.HitRate-rep.IdealHitRate) > 1e-12 || o.Bound.HitTokens > o.Ideal.HitTokens || o.Bound.HitTokens <= 0 ||
		o.Bound.PromptTokens != o.Ideal.PromptTokens || o.CapacityTokens <= 0 {
		t.Errorf("oracle %+v against ideal hit rate %v", o, rep.IdealHitRate)
	}
	md := rep.Markdown()
	for i := range rep.Results {
		res := &rep.Results[i]
		if want := float64(res.HitTokens) / float64(o.Bound.HitTokens); math.Abs(res.OfBound-want) > 1e-12 || res.OfIdeal > res.OfBound {
			t.Errorf("%s: %v of bound, %v of ideal, from %d hit tokens against %d and %d", res.Router, res.OfBound, res.OfIdeal, res.HitTokens, o.Bound.HitTokens, o.Ideal.HitTokens)
		}
		if cell := fmt.Sprintf("| %.3f | %.3f |", res.OfBound, res.OfIdeal); !strings.Contains(md, cell) {
			t.Errorf("%s: markdown lacks %q", res.Router, cell)
		}
		checkPinned(t, res, o, md)
		checkOwnPlacement(t, res, o, md)
		checkHeld(t, res, md)
	}
	if !strings.Contains(md, "Finite-cache bound") || !strings.Contains(md, pct(o.Bound.HitRate)) {
		t.Errorf("markdown lacks the bound:\n%s", md)
	}
}

// readReport reads the Markdown and JSON reports a run wrote into out.
func readReport(t *testing.T, out string) (string, Report) {
	t.Helper()
	md, err := os.ReadFile(filepath.Join(out, FileMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(out, FileJSON))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("results.json: %v", err)
	}
	return string(md), back
}
