package router

import (
	"math/rand/v2"
	"testing"
)

// fixTies makes ranked's tie-break deterministic for one test: the last
// candidate of equal rank wins (draw 0), or the first.
func fixTies(t *testing.T, last bool) {
	t.Helper()
	if last {
		tieDraw = func(int) int { return 0 }
	} else {
		tieDraw = func(n int) int { return n - 1 }
	}
	t.Cleanup(func() { tieDraw = rand.IntN })
}

// ranked keeps the first of the best rank, and of ties the one tieDraw
// says.
func TestRanked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int // how each candidate compares with the best before it
		last  bool
		best  int
		ties  int
	}{
		{"none offered", nil, true, 0, 0},
		{"one", []int{1}, true, 0, 1},
		{"better later", []int{0, -1, 1}, true, 1, 1},
		{"worse later", []int{0, 1, 1}, true, 0, 1},
		{"ties, last wins", []int{0, 0, 0}, true, 2, 3},
		{"ties, first wins", []int{0, 0, 0}, false, 0, 3},
		{"a better one resets the ties", []int{0, 0, -1, 1}, true, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fixTies(t, tc.last)
			var r ranked
			for i, c := range tc.order {
				r.offer(i, c)
			}
			if r.best != tc.best || r.ties != tc.ties {
				t.Errorf("best %d (ties %d), want %d (%d)", r.best, r.ties, tc.best, tc.ties)
			}
		})
	}
}

// bestTurn ranks by match less price of the load prices, then load per
// weight, among the candidates kept.
func TestBestTurn(t *testing.T) {
	// Match 1024 scored 624 (a queue price of 400), match 512 scored 512.
	held := Score{Matched: 1024, Score: 624, Load: 3, Weight: 1}
	other := Score{Matched: 512, Score: 512, Load: 0, Weight: 1}
	for _, tc := range []struct {
		name   string
		scores []Score
		keep   mask
		price  float64
		want   int
	}{
		{"price 0: the match", []Score{held, other}, mask{true, true}, 0, 0},
		{"price 1: the score", []Score{held, other}, mask{true, true}, 1, 0},
		{"price 1, a dearer queue", []Score{{Matched: 1024, Score: 400, Weight: 1}, other}, mask{true, true}, 1, 1},
		{"price 0.5: 1024·0.5+400·0.5 < 512", []Score{{Matched: 1024, Score: 0, Weight: 1}, other}, mask{true, true}, 0.5, 1},
		{"kept only", []Score{held, other}, mask{false, true}, 0, 1},
		{"equal: less load per weight", []Score{held, {Matched: 1024, Score: 624, Load: 3, Weight: 2}}, mask{true, true}, 0, 1},
		{"none kept", []Score{held, other}, mask{false, false}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fixTies(t, true)
			if got := bestTurn(tc.scores, tc.keep, tc.price); got != tc.want {
				t.Errorf("bestTurn = %d, want %d", got, tc.want)
			}
		})
	}
}

// cheapest ranks by cold cost, then load per weight, then KV usage, then
// the tie-break.
func TestCheapest(t *testing.T) {
	tu := &CacheAwareConfig{Lambda: 100, Mu: 1000}
	all := func(int) bool { return true }
	for _, tc := range []struct {
		name   string
		scores []Score
		last   bool
		want   int
	}{
		{"least cost", []Score{{Queue: 2, Weight: 1}, {Queue: 1, Weight: 1}}, true, 1},
		{"cost per weight", []Score{{Queue: 2, Weight: 4}, {Queue: 1, Weight: 1}}, true, 0},
		{"equal cost: less load", []Score{{Load: 1, Weight: 1}, {Load: 0, Weight: 1}}, true, 1},
		// 1000·0.1 = 100·1: equal cost and load.
		{"equal cost and load: less kv", []Score{{KVUsage: 0.1, Weight: 1}, {Queue: 1, Weight: 1}}, true, 1},
		{"a tie, last wins", []Score{{Weight: 1}, {Weight: 1}}, true, 1},
		{"a tie, first wins", []Score{{Weight: 1}, {Weight: 1}}, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fixTies(t, tc.last)
			if got := cheapest(tc.scores, all, tu, nil); got != tc.want {
				t.Errorf("cheapest = %d, want %d", got, tc.want)
			}
		})
	}
}
