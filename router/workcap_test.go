package router

import (
	"slices"
	"testing"
	"time"
)

// balancedPolicy is testPolicy with the branch rule and workCap on, at
// their defaults.
func balancedPolicy() *CacheAware {
	o := testOptions()
	o.BranchBalance, o.Nu = 1.25, 0.1
	return NewCacheAware(o, NewSessions(time.Minute))
}

// Conversations after a shared system prompt, started one after another
// while the earlier ones go on (2 to 14 turns), each take a replica of
// their own while one is idle: a new conversation does not join a holder
// already serving one although that holder's work is within the branch
// balance of the mean, since the mean is taken over the replicas workCap
// leaves. Each conversation keeps its replica meanwhile.
func TestNewConversationsTakeIdleReplicas(t *testing.T) {
	reps := testFleet(t, 8)
	p := balancedPolicy()
	system := seqKey(1, 1000)
	home := map[string]int{} // replica name -> conversations
	for c := range 7 {
		key := append(slices.Clone(system), seqKey(uint32(10+c), 300)...)
		var rep string
		for turn := range 2 + 2*c {
			d := p.Pick(&Request{Key: key}, reps)
			d.Started()
			if turn == 0 {
				rep = d.Replica.Name()
				home[rep]++
			} else if got := d.Replica.Name(); got != rep {
				t.Fatalf("conversation %d turn %d went to %s (%s), its replica is %s", c, turn, got, d.Reason, rep)
			}
			key = append(key, seqKey(uint32(100+10*c+turn), 400)...)
		}
	}
	for name, n := range home {
		if n > 1 {
			t.Errorf("%s took %d of 7 conversations on 8 replicas: %v", name, n, home)
		}
	}
}

// Cold requests do not pile onto a replica that took far more prefill work
// than the others, though its queue is as empty as theirs.
func TestColdRequestsAvoidTheBusiest(t *testing.T) {
	reps := testFleet(t, 4)
	p := balancedPolicy()
	big := p.Pick(&Request{Key: seqKey(1, 4000)}, reps)
	big.Started()
	for i := range 20 {
		d := p.Pick(&Request{Key: seqKey(uint32(100+i), 20)}, reps)
		d.Started()
		if d.Replica == big.Replica {
			t.Fatalf("cold request %d went to %s (%s), which prefilled 200 times its work", i, d.Replica.Name(), d.Reason)
		}
	}
}

// capWork keeps the candidates whose work after the request is within the
// balance of the mean, or no more than the least, each with capSlack of
// the prompt to spare; a next turn's work counts without its pending
// prefill.
func TestCapWork(t *testing.T) {
	for _, tc := range []struct {
		name    string
		keep    mask
		work    []float64
		adds    []float64
		pending []int64
		balance float64
		turn    bool
		want    mask
	}{
		// Mean 1500 before; 1.25·(3000+1000)/2 = 2500 (+100 slack).
		{"within the balance", mask{true, true}, []float64{1000, 2000}, []float64{1000, 0}, nil, 1.25, false, mask{true, true}},
		{"over the balance and the least", mask{true, true}, []float64{9000, 0}, []float64{1000, 1000}, nil, 1.25, false, mask{false, true}},
		{"over the balance, the least after", mask{true, true}, []float64{5000, 4000}, []float64{0, 1000}, nil, 1.0, false, mask{true, true}},
		{"balance 0: off", mask{true, true}, []float64{9000, 0}, []float64{1000, 1000}, nil, 0, false, mask{true, true}},
		{"one kept: no mean", mask{true, false}, []float64{9000, 0}, []float64{1000, 1000}, nil, 1.25, false, mask{true, false}},
		{"not kept stays out", mask{true, true, false}, []float64{9000, 0, 0}, []float64{1000, 1000, 1000}, nil, 1.25, false, mask{false, true, false}},
		{"turn: pending prefill not counted", mask{true, true}, []float64{9000, 0}, []float64{0, 1000}, []int64{8000, 0}, 1.25, true, mask{true, true}},
		{"turn: without pending, over", mask{true, true}, []float64{9000, 0}, []float64{0, 1000}, []int64{0, 0}, 1.25, true, mask{false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			scores := make([]Score, len(tc.keep))
			for i := range scores {
				scores[i].Weight = 1
				if tc.pending != nil {
					scores[i].Pending = tc.pending[i]
				}
			}
			got := capWork(nil, tc.keep, scores, tc.work, tc.adds, 1000, tc.balance, tc.turn)
			if !slices.Equal(got, tc.want) {
				t.Errorf("capWork = %v, want %v", got, tc.want)
			}
		})
	}
}
