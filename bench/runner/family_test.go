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
		}
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
			if !strings.Contains(string(md), "| "+s+" | kvroute/"+r+" | ") {
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
