package server_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
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
// at a time (turn 0 of each, then turn 1 of each, ...): with no concurrency
// the load bound never acts, yet the conversations spread over the
// replicas, and each keeps its replica from its first turn on. On eight
// replicas none is left idle while another takes a third conversation.
func TestSequentialConversationsSpread(t *testing.T) {
	for _, tc := range []struct {
		replicas, minUsed, maxPer int
		system                    int // repeats of the system prompt's sentence, 16 tokens each
	}{
		{replicas: 4, minUsed: 3, maxPer: 12, system: 25},
		// A system prompt far longer than a question: holders stay within
		// the balance of the mean before every replica holds it.
		{replicas: 8, minUsed: 8, maxPer: 2, system: 250},
	} {
		t.Run(fmt.Sprintf("%d replicas", tc.replicas), func(t *testing.T) {
			var reps []*kvtest.Replica
			for i := 0; i < tc.replicas; i++ {
				reps = append(reps, kvtest.NewReplica(t, fmt.Sprintf("r%d", i), nil))
			}
			k := kvtest.Start(t, reps, func(cfg *config.Config) { cfg.Policy = "cache_aware" })
			system := strings.Repeat("You are the support assistant of a large fleet; answer briefly and precisely. ", tc.system)
			const convs, turns = 12, 6
			home := map[int]string{}
			per := map[string]int{}
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
						per[got]++
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
			most := 0
			for _, n := range per {
				most = max(most, n)
			}
			if len(per) < tc.minUsed || most > tc.maxPer {
				t.Errorf("conversations per replica %v, want at least %d replicas used and at most %d on one", per, tc.minUsed, tc.maxPer)
			}
			if float64(onHome) < 0.95*float64(total) {
				t.Errorf("%d of %d later turns on their conversation's replica, want at least 95%%", onHome, total)
			}
		})
	}
}

// A prefix many conversations branch from gains a holder once its holder's
// recent prefill work exceeds cache_aware.branch_balance times the mean,
// and the branches then share the holders; with the rule off, every branch
// stays on the first holder.
func TestSharedPrefixGainsHoldersAsItsWorkGrows(t *testing.T) {
	for _, balance := range []float64{1.25, 0} {
		t.Run(fmt.Sprintf("branch_balance=%v", balance), func(t *testing.T) {
			a, b := kvtest.NewReplica(t, "a", nil), kvtest.NewReplica(t, "b", nil)
			k := kvtest.Start(t, []*kvtest.Replica{a, b}, func(cfg *config.Config) {
				cfg.Policy = "cache_aware"
				kvtest.WithCacheAware(func(c *router.CacheAwareConfig) { c.BranchBalance = balance })(cfg)
			})
			system := strings.Repeat("Shared instructions for every conversation of this tenant. ", 30)
			var seq []string
			count := map[string]int{}
			for c := 0; c < 8; c++ {
				resp, _ := postJSON(t, k.URL+"/v1/chat/completions", chatBody(system, c, 0))
				rep := resp.Header.Get("X-Kvroute-Backend")
				seq = append(seq, rep+" "+resp.Header.Get("X-Kvroute-Route"))
				count[rep]++
			}
			first := strings.Fields(seq[0])[0]
			if balance == 0 {
				if count[first] != len(seq) {
					t.Errorf("rule off: branches %v, want all on %s", seq, first)
				}
				return
			}
			// The first holder's work is the whole prompt; the mean is
			// half of it: the second branch goes to the other replica.
			if strings.Fields(seq[1])[0] == first || !strings.Contains(seq[1], "spread") {
				t.Errorf("branch 1: %s, want the prefix spread to the other replica: %v", seq[1], seq)
			}
			if d := count["a"] - count["b"]; d > 2 || d < -2 {
				t.Errorf("branches a %d, b %d once both hold the prefix: want them shared (%v)", count["a"], count["b"], seq)
			}
		})
	}
}
