package router

import "testing"

// Each scorer prices its term in tokens; the score is their sum.
func TestScorers(t *testing.T) {
	tu := &CacheAwareConfig{Lambda: 100, Mu: 1000, Nu: 0.5}
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"match: whole blocks", float64(matchTokens(1000, 16)), 992},
		{"match: a block exactly", float64(matchTokens(32, 16)), 32},
		{"match: less than a block", float64(matchTokens(15, 16)), 0},
		{"match: nothing", float64(matchTokens(0, 16)), 0},
		{"match: engine block 256", float64(matchTokens(1000, 256)), 768},
		{"queue: λ a request", queuePrice(3, tu.Lambda), 300},
		{"pending: ν a token", pendingPrice(400, tu.Nu), 200},
		{"pending: cold, at face value", pendingPrice(400, coldPendingPrice), 400},
		{"kv: μ at full memory", kvPrice(1, tu.Mu), 1000},
		{"kv: a fraction", kvPrice(0.25, tu.Mu), 250},
		{"evicted: half a token each", evictCost(1000), 500},
		{"score: m − (λq + νP)/w − μk", scoreOf(&Score{Matched: 1024, Queue: 2, Pending: 400, Weight: 2, KVUsage: 0.1}, tu),
			1024 - (100*2+0.5*400)/2 - 100},
		{"score: weight 1, idle", scoreOf(&Score{Matched: 512, Weight: 1}, tu), 512},
		{"cold cost: (λq + P)/w + μk + evicted/2", coldCost(Score{Queue: 2, Pending: 400, Weight: 2, KVUsage: 0.1, Evicts: 100}, tu),
			(100*2+400)/2 + 100 + 50},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}
