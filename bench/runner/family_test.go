package runner

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The family on tiny sizes over real simulated replicas: every synthetic
// shape × router is in the table, with no errors; the trace shapes are
// skipped with a note; no router beats the ideal, round-robin does not
// beat the finite-cache bound, and the bound never beats the ideal.
func TestFamilyEndToEnd(t *testing.T) {
	o := DefaultOptions()
	o.Replicas = 2
	o.TimeScale = 0.02
	routers := []string{"cache_aware", "round_robin"}
	o.Routers = routers
	o.Out = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunFamily(ctx, FamilyOptions{Options: o, Seed: 3, Scale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	synthetic := slices.DeleteFunc(slices.Clone(Shapes), func(s string) bool { return s == ShapeMooncake || s == ShapeAzure })
	var got []string
	anyHeld := false // some request found its prompt held on its replica as it arrived
	for _, s := range rep.Shapes {
		got = append(got, s.Shape)
		o := s.Oracle
		if o == nil || s.Requests == 0 || o.Bound.HitTokens > o.Ideal.HitTokens || o.Ideal.PromptTokens != o.Bound.PromptTokens {
			t.Errorf("%s: %d requests, oracle %+v", s.Shape, s.Requests, o)
			continue
		}
		if len(s.Rows) != len(routers) {
			t.Errorf("%s: %d rows, want one per router %v", s.Shape, len(s.Rows), routers)
		}
		for _, row := range s.Rows {
			if row.Error != "" || row.Errors != 0 || row.OK != s.Requests {
				t.Errorf("%s × %s: error %q, %d/%d ok", s.Shape, row.Router, row.Error, row.OK, s.Requests)
			}
			if row.TTFTP90 <= 0 || row.TTFTP90 < row.TTFTP50 {
				t.Errorf("%s × %s: TTFT p50 %v p90 %v", s.Shape, row.Router, row.TTFTP50, row.TTFTP90)
			}
			// Nothing beats one unbounded cache. The bound holds the cap at
			// every step, so a router that concentrates work early may beat
			// it (on tiny workloads even when its final max/mean is within
			// the cap); one that ignores caches and keeps the work even
			// does not.
			if row.OfIdeal > 1+1e-9 || (row.Router == "kvroute/round_robin" && row.OfBound > 1+1e-9) {
				t.Errorf("%s × %s: %.3f of the bound, %.3f of the ideal", s.Shape, row.Router, row.OfBound, row.OfIdeal)
			}
			if s.Shape != ShapeNoReuse && row.OfIdeal <= 0 {
				t.Errorf("%s × %s: no hits", s.Shape, row.Router)
			}
			// kvroute names each answer's replica: its own placement is
			// replayed wherever the bound finds hits.
			if s.Oracle != nil && s.Oracle.Bound.HitTokens > 0 && row.OwnPlacementOfBound <= 0 {
				t.Errorf("%s × %s: no own placement replayed", s.Shape, row.Router)
			}
			// No replica holds more than the most any replica holds.
			if row.HeldOfBest < 0 || row.HeldOfBest > 1+1e-9 {
				t.Errorf("%s × %s: held %.3f of the most any replica held", s.Shape, row.Router, row.HeldOfBest)
			}
			anyHeld = anyHeld || row.HeldOfBest > 0
		}
	}
	if !anyHeld {
		t.Error("no row found a prompt held on its replica as the request arrived")
	}
	if !slices.Equal(got, synthetic) {
		t.Errorf("shapes %v, want %v", got, synthetic)
	}
	if len(rep.Notes) < 2 || !strings.Contains(strings.Join(rep.Notes, "\n"), "mooncake: skipped") {
		t.Errorf("notes %q lack the skipped traces", rep.Notes)
	}
	md, err := os.ReadFile(filepath.Join(o.Out, FileFamilyMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range synthetic {
		for _, r := range routers {
			if !strings.Contains(string(md), "| "+s+" | kvroute/"+r+" | ") || !strings.Contains(string(md), "| placement | held |") {
				t.Errorf("family.md lacks the row %s × %s", s, r)
			}
		}
		if _, err := os.Stat(filepath.Join(o.Out, s, FileMarkdown)); err != nil {
			t.Errorf("%s: no report of its own: %v", s, err)
		}
	}
	var back FamilyReport
	if js, err := os.ReadFile(filepath.Join(o.Out, FileFamilyJSON)); err != nil || json.Unmarshal(js, &back) != nil || len(back.Shapes) != len(synthetic) {
		t.Errorf("family.json: %v, %d shapes", err, len(back.Shapes))
	}
	t.Log("\n" + rep.Markdown())
}

// A heavy family runs each shape at its own point of HeavyLoads (here
// tiny ones, over real simulated replicas): the shape's size follows its
// point, the report and both tables say which load each shape ran at, and
// sequential, which has no heavy point, runs at the default load with a
// note. Scales given beside Heavy are refused.
func TestFamilyHeavy(t *testing.T) {
	saved := HeavyLoads
	t.Cleanup(func() { HeavyLoads = saved })
	HeavyLoads = map[string]FamilyLoad{
		ShapeNoReuse:   {Scale: 0.03, RateScale: 2, TimeScale: 0.02},
		ShapeHotPrefix: {Scale: 0.06, RateScale: 4, TimeScale: 0.03},
	}
	o := DefaultOptions()
	o.Replicas = 2
	o.Routers = []string{"round_robin"}
	o.Out = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	shapes := []string{ShapeHotPrefix, ShapeNoReuse, ShapeSequential}
	if _, err := RunFamily(ctx, FamilyOptions{Options: o, Seed: 3, Scale: 2, Heavy: true, Shapes: shapes}); err == nil {
		t.Fatal("a heavy family with scale 2 ran")
	}
	rep, err := RunFamily(ctx, FamilyOptions{Options: o, Seed: 3, Heavy: true, Shapes: shapes})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Heavy || len(rep.Shapes) != 3 {
		t.Fatalf("heavy %v, %d shapes", rep.Heavy, len(rep.Shapes))
	}
	want := map[string]int{ShapeHotPrefix: 18, ShapeNoReuse: 9} // 300 × the point's scale
	md := rep.Markdown()
	for _, s := range rep.Shapes {
		if s.Shape == ShapeSequential {
			if s.Load != nil {
				t.Errorf("sequential ran at %v, want its default load", *s.Load)
			}
			continue
		}
		l := HeavyLoads[s.Shape]
		if s.Load == nil || *s.Load != l || s.Requests != want[s.Shape] {
			t.Errorf("%s: load %v, %d requests; want %v, %d", s.Shape, s.Load, s.Requests, l, want[s.Shape])
			continue
		}
		if !strings.Contains(md, "| "+l.String()+" | ") {
			t.Errorf("family.md does not give %s's load %q:\n%s", s.Shape, l, md)
		}
		for _, row := range s.Rows {
			if row.Errors != 0 || row.OK != s.Requests {
				t.Errorf("%s × %s: %d/%d ok", s.Shape, row.Router, row.OK, s.Requests)
			}
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "sequential: no heavy point") {
		t.Errorf("notes %q do not say sequential has no heavy point", rep.Notes)
	}
	if !strings.Contains(md, "each shape at its heavy point") {
		t.Errorf("family.md does not say the family ran heavy:\n%s", md)
	}
}
