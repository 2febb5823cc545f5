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
