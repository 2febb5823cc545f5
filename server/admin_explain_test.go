package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
)

// decisionFamilies are the metric families a routing decision moves:
// requests and their decisions, matches, the Index, sessions and renders.
var decisionFamilies = []string{
	"kvroute_requests_total", "kvroute_routing_decision_seconds", "kvroute_matched_tokens",
	"kvroute_key_tokens_total", "kvroute_predicted_cached_tokens_total", "kvroute_retries_total",
	"kvroute_tree_", "kvroute_index_", "kvroute_sessions", "kvroute_session_ids_rejected_total",
	"kvroute_precise_",
}

// getOK returns the body of a GET of url, which must answer 200.
func getOK(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := httpGet(t, http.DefaultClient, url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: status %d, %v: %s", url, resp.StatusCode, err, b)
	}
	return b
}

// decisionMetrics returns the lines of the admin listener's /metrics in
// decisionFamilies.
func decisionMetrics(t *testing.T, admin string) string {
	t.Helper()
	var keep []string
	for line := range strings.Lines(string(getOK(t, admin+"/metrics"))) {
		for _, f := range decisionFamilies {
			if strings.HasPrefix(line, f) {
				keep = append(keep, line)
				break
			}
		}
	}
	return strings.Join(keep, "")
}

// explainState is what the admin endpoint's callers can see of the
// routing state: the decision metrics, the Index as /debug/tree shows it,
// and the session table.
type explainState struct {
	Metrics  string
	Tree     any
	Sessions router.SessionStats
	Bound    string
}

func stateOf(t *testing.T, k *kvtest.KV, session string) explainState {
	t.Helper()
	var tree map[string]any
	if err := json.Unmarshal(getOK(t, k.Admin+"/debug/tree"), &tree); err != nil {
		t.Fatal(err)
	}
	delete(tree, "tokenizer") // its caches memoize tokens, whoever asked
	st := explainState{Metrics: decisionMetrics(t, k.Admin), Tree: tree, Sessions: k.Srv.Router.Sessions().Stats()}
	if rep := k.Srv.Router.Sessions().Lookup(session, time.Now()); rep != nil {
		st.Bound = rep.Name()
	}
	return st
}

// /debug/route changes nothing, whatever the registered policy: 100 calls
// name the same replica, leave the decision metrics, the Index and the
// session table as they were, and the request then sent for real goes to
// the replica they named. A policy that cannot explain (one a test
// registered with Pick alone) is refused with 501, changing nothing
// either.
func TestDebugRouteChangesNothing(t *testing.T) {
	prompt := strings.Repeat("a system prompt long enough to be matched as a cached prefix. ", 20)
	body := `{"model":"m1","messages":[{"role":"system","content":"` + prompt + `"},{"role":"user","content":"hello"}]}`
	for _, policy := range router.Names() {
		t.Run(policy, func(t *testing.T) {
			p, err := router.NewPolicy(policy, router.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			_, explains := p.(router.Explainer)
			refused := false
			reps := []*kvtest.Replica{kvtest.NewReplica(t, "r0", nil), kvtest.NewReplica(t, "r1", nil), kvtest.NewReplica(t, "r2", nil)}
			k := kvtest.Start(t, reps, func(cfg *config.Config) { cfg.Policy = policy })
			// Loads 2, 1, 0: no tie is broken at random.
			for _, name := range []string{"r0", "r0", "r1"} {
				t.Cleanup(k.Srv.Fleet.ByName(name).Acquire())
			}
			hdr := map[string]string{k.Srv.Config().Session.Header: "s1"}
			if resp, b := kvtest.Post(t, k.URL+"/v1/chat/completions", body, hdr); resp.StatusCode != http.StatusOK { //nolint:bodyclose // Post reads and closes the body
				t.Fatalf("first request: status %d: %s", resp.StatusCode, b)
			}
			// The first request's metrics are counted once it ended.
			var before explainState
			kvtest.WaitFor(t, 5*time.Second, "the metrics to settle", func() bool {
				before = stateOf(t, k, "s1")
				time.Sleep(20 * time.Millisecond)
				return stateOf(t, k, "s1").Metrics == before.Metrics
			})
			// Every other call carries a session ID past the bound, which
			// a real decision counts as rejected.
			long := map[string]string{k.Srv.Config().Session.Header: strings.Repeat("x", k.Srv.Config().Session.MaxIDBytes+1)}
			var named, namedLong string
			for i := range 100 {
				h, first := hdr, &named
				if i%2 == 1 {
					h, first = long, &namedLong
				}
				resp, b := kvtest.Post(t, k.Admin+"/debug/route", body, h) //nolint:bodyclose // Post reads and closes the body
				if resp.StatusCode == http.StatusNotImplemented && !explains {
					refused = true
					continue
				}
				var out struct{ Replica string }
				if err := json.Unmarshal(b, &out); err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("/debug/route %d: status %d: %s", i, resp.StatusCode, b)
				}
				if *first == "" {
					*first = out.Replica
				} else if out.Replica != *first {
					t.Fatalf("/debug/route %d named %s, the first like it named %s", i, out.Replica, *first)
				}
			}
			if after := stateOf(t, k, "s1"); after.Metrics != before.Metrics || after.Sessions != before.Sessions || after.Bound != before.Bound {
				t.Errorf("100 calls of /debug/route changed the state:\nbefore %+v\nafter  %+v", before, after)
			} else if a, b := jsonOf(t, after.Tree), jsonOf(t, before.Tree); a != b {
				t.Errorf("100 calls of /debug/route changed /debug/tree:\nbefore %s\nafter  %s", b, a)
			}
			if refused {
				return
			}
			resp, b := kvtest.Post(t, k.URL+"/v1/chat/completions", body, hdr) //nolint:bodyclose // Post reads and closes the body
			if got := resp.Header.Get("X-Kvroute-Backend"); resp.StatusCode != http.StatusOK || got != named {
				t.Errorf("the request went to %q (status %d: %s), /debug/route named %s", got, resp.StatusCode, b, named)
			}
		})
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
