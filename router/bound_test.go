package router

import (
	"slices"
	"testing"
)

// The load-bound filter keeps the candidates within the bound, those whose
// match pays for their excess (relaxBound), or all when none is within.
func TestBoundFilter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		matched []int
		excess  []float64
		lambda  float64
		keep    []bool
		allOver bool
	}{
		{"all within", []int{0, 1024}, []float64{0, -1}, 1024, []bool{true, true}, false},
		{"one over, its match does not pay", []int{1024, 0}, []float64{2, -1}, 1024, []bool{false, true}, false},
		{"one over, its match pays", []int{4096, 0}, []float64{2, -1}, 1024, []bool{true, true}, false},
		{"λ 0: the bound stands", []int{1 << 20, 0}, []float64{1, -1}, 0, []bool{false, true}, false},
		{"all over: all kept", []int{0, 0}, []float64{1, 2}, 1024, []bool{true, true}, true},
		{"all over but one the relaxation keeps", []int{4096, 0}, []float64{2, 1}, 1024, []bool{true, false}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scores := make([]Score, len(tc.matched))
			for i := range scores {
				scores[i] = Score{Matched: tc.matched[i], Weight: 1, OverBound: tc.excess[i] > 0, excess: tc.excess[i]}
			}
			keep, allOver := boundFilter(scores, tc.lambda, mask{true}) // a mask of another length is resized
			if !slices.Equal(keep, tc.keep) || allOver != tc.allOver {
				t.Errorf("keep %v, all over %v; want %v, %v", keep, allOver, tc.keep, tc.allOver)
			}
		})
	}
}

func TestMaskAll(t *testing.T) {
	for _, n := range []int{0, 1, 5} {
		m := mask{false, false}.all(n)
		if len(m) != n || slices.Contains(m, false) {
			t.Errorf("all(%d) = %v", n, m)
		}
	}
}
