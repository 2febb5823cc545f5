package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// chatBody renders a conversation: the system prompt, then turns user and
// assistant messages, then the next user message.
func chatBody(system string, conv, turns int) string {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for t := 0; t < turns; t++ {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d asks question %d: %s", conv, t, strings.Repeat("what about the next part? ", 12))},
			map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d to conversation %d: %s", t, conv, strings.Repeat("it works like this. ", 15))})
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("conversation %d asks question %d: %s", conv, turns, strings.Repeat("what about the next part? ", 12))})
	b, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs})
	return string(b)
}

// Twelve conversations sharing one system prompt, sent strictly one request
// at a time to four replicas: with no concurrency the load bound never
// acts, yet the conversations spread over the replicas, and each keeps its
// replica from its first turn on.
func TestSequentialConversationsSpread(t *testing.T) {
	var reps []*kvtest.Replica
	for i := 0; i < 4; i++ {
		reps = append(reps, kvtest.NewReplica(t, fmt.Sprintf("r%d", i), nil))
	}
	k := kvtest.Start(t, reps, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
	system := strings.Repeat("You are the support assistant of a large fleet; answer briefly and precisely. ", 25)
	const convs, turns = 12, 6
	home := map[int]string{}
	used := map[string]bool{}
	onHome, total := 0, 0
	for turn := 0; turn < turns; turn++ {
		for c := 0; c < convs; c++ {
			resp, out := postJSON(t, k.URL+"/v1/chat/completions", chatBody(system, c, turn))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			got := resp.Header.Get("X-Kvroute-Backend")
			if turn == 0 {
				home[c] = got
				used[got] = true
				continue
			}
			total++
			if got == home[c] {
				onHome++
			} else {
				t.Logf("conversation %d turn %d went to %s (%s), its home is %s", c, turn, got, resp.Header.Get("X-Kvroute-Route"), home[c])
			}
		}
	}
	if len(used) < 3 {
		t.Errorf("the conversations started on %d replicas (%v), want at least 3 of 4", len(used), home)
	}
	if float64(onHome) < 0.95*float64(total) {
		t.Errorf("%d of %d later turns on their conversation's replica, want at least 95%%", onHome, total)
	}
}

// A prefix many conversations branch from gains holders as its branches
// grow, with hysteresis: each holder takes new branches until it carries
// cache_aware.spread_branches more than a replica lacking the prefix; with
// the rule off, every branch stays on the first holder.
func TestSharedPrefixReplicatesWithHysteresis(t *testing.T) {
	for _, spread := range []int{2, 3, 0} {
		t.Run(fmt.Sprintf("spread_branches=%d", spread), func(t *testing.T) {
			a, b := kvtest.NewReplica(t, "a", nil), kvtest.NewReplica(t, "b", nil)
			k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(cfg *config.Config) {
				cfg.Policy = "cache_aware"
				cfg.CacheAware.SpreadBranches = spread
			})
			system := strings.Repeat("Shared instructions for every conversation of this tenant. ", 30)
			var seq []string
			for c := 0; c < 8; c++ {
				resp, _ := postJSON(t, k.URL+"/v1/chat/completions", chatBody(system, c, 0))
				seq = append(seq, resp.Header.Get("X-Kvroute-Backend")+" "+resp.Header.Get("X-Kvroute-Route"))
			}
			first := strings.Fields(seq[0])[0]
			count := map[string]int{}
			for i, s := range seq {
				rep := strings.Fields(s)[0]
				count[rep]++
				if i == 0 {
					continue
				}
				if spread == 0 {
					if rep != first {
						t.Errorf("rule off: branch %d went to %s, want %s: %v", i, s, first, seq)
					}
					continue
				}
				// The other replica lacks the prefix until the first
				// holder carries spread more branches than it.
				if i < spread && rep != first {
					t.Errorf("branch %d went to %s before the holder carried %d more: %v", i, s, spread, seq)
				}
				if i == spread && (rep == first || !strings.Contains(s, "spread")) {
					t.Errorf("branch %d: %s, want the prefix spread to the other replica: %v", i, s, seq)
				}
			}
			if spread > 0 {
				// Both now hold it: branches alternate to the one with fewer.
				if d := count["a"] - count["b"]; d > 1 || d < -1 {
					t.Errorf("branches a %d, b %d after both hold the prefix: want balanced within one (%v)", count["a"], count["b"], seq)
				}
			}
		})
	}
}
