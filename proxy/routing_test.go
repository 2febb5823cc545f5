package proxy_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/router"
)

// words makes deterministic filler text of about n tokens.
func words(seed string, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%s%d ", seed, i%97)
	}
	return b.String()
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func chatJSON(msgs []msg) string {
	b, _ := json.Marshal(map[string]any{"model": "m1", "messages": msgs})
	return string(b)
}

func cacheAware(c *config.Config) { c.Policy = "cache_aware" }

// slowEcho answers after d.
func slowEcho(d time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(d)
		kvtest.Echo(w, r, nil)
	}
}

func fleetOf(t *testing.T, n int, h http.HandlerFunc) []*kvtest.Replica {
	var reps []*kvtest.Replica
	for i := 0; i < n; i++ {
		reps = append(reps, kvtest.NewReplica(t, fmt.Sprintf("r%d", i), h))
	}
	return reps
}

// conversation sends turns of one conversation in order and returns the
// replica of each turn.
func conversation(t *testing.T, url, system, user string, turns int, hdr map[string]string) []string {
	t.Helper()
	msgs := []msg{{"system", system}}
	var got []string
	for i := 0; i < turns; i++ {
		msgs = append(msgs, msg{"user", words(fmt.Sprintf("%s-q%d-", user, i), 1200)})
		resp, body := postJSON(t, url+"/v1/chat/completions", chatJSON(msgs), hdr)
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
		got = append(got, resp.Header.Get("X-Kvroute-Backend"))
		msgs = append(msgs, msg{"assistant", words(fmt.Sprintf("%s-a%d-", user, i), 800)})
	}
	return got
}

func TestConversationStaysWhileSharedPromptSpreads(t *testing.T) {
	reps := fleetOf(t, 4, slowEcho(150*time.Millisecond))
	// The fake replicas report no request waiting whatever they carry, so
	// the load bound's floor (cache_aware.bound_floor) would let up to 8
	// conversations join each holder; the spread below is the proportional
	// bound's.
	k := kvtest.Start(t, reps, cacheAware, kvtest.WithCacheAware(func(c *router.CacheAwareConfig) { c.BoundFloor = 0 }))
	system := words("system", 2000)

	// One conversation of 10 turns stays on one replica.
	got := conversation(t, k.URL, system, "solo", 10, nil)
	for i, r := range got {
		if r != got[0] {
			t.Fatalf("turn %d moved from %s to %s (%v)", i, got[0], r, got)
		}
	}

	// 20 concurrent conversations sharing the long system prompt spread
	// over every replica, and each stays where it started. They go through
	// a second kvroute: on the first, the solo conversation's recent
	// prefill work keeps new branches off its replica until the others
	// have as much (the branch balance), which left that replica one
	// conversation or none depending on how fast the machine ran.
	k = kvtest.Start(t, reps, cacheAware, kvtest.WithCacheAware(func(c *router.CacheAwareConfig) { c.BoundFloor = 0 }))
	var mu sync.Mutex
	homes := map[string]int{}
	var wg sync.WaitGroup
	for c := 0; c < 20; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			got := conversation(t, k.URL, system, fmt.Sprintf("user%d", c), 3, nil)
			mu.Lock()
			defer mu.Unlock()
			homes[got[0]]++
			for _, r := range got[1:] {
				if r != got[0] {
					homes["moved"]++
				}
			}
		}(c)
	}
	wg.Wait()
	for _, r := range reps {
		if homes[r.Name] == 0 {
			t.Errorf("replica %s got no conversation: %v", r.Name, homes)
		}
	}
	// Later turns of these concurrent conversations may move: their replica
	// can be over the load bound or have more prefill queued than the turn
	// would save. Stickiness is asserted by the solo conversation above.
	t.Logf("%d of 40 later turns moved: %v", homes["moved"], homes)
}

func TestRoundRobinScattersTurns(t *testing.T) {
	reps := fleetOf(t, 4, nil)
	k := kvtest.Start(t, reps) // round_robin
	got := conversation(t, k.URL, words("system", 500), "solo", 8, nil)
	seen := map[string]bool{}
	for _, r := range got {
		seen[r] = true
	}
	if len(seen) != 4 {
		t.Errorf("round robin sent 8 turns to %d replicas: %v", len(seen), got)
	}
}

// A holder carrying as many requests as the load bound allows sheds the
// next to the other replica, which then holds the prefix too, unless its
// match pays for going past the bound. With two replicas the bound is
// ceil(1.25·(in flight+1)/2); its floor is off here, since these fake
// replicas report no request waiting whatever they carry (with it, the
// queue price moves the request once a few are in flight). With λ 0 no
// match pays; at the default λ (2048 tokens a request) the prompt's 6,000
// matched tokens pay for the one request past the bound.
func TestOverloadedHolderShedsToSecondHolder(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lambda float64
		sheds  bool
	}{
		{"lambda 0: sheds", 0, true},
		{"default lambda: the match pays", config.Default().PolicyConfig(router.CacheAwareName).(*router.CacheAwareConfig).Lambda, false},
	} {
		t.Run(tc.name, func(t *testing.T) { overloadHolder(t, tc.lambda, tc.sheds) })
	}
}

func overloadHolder(t *testing.T, lambda float64, sheds bool) {
	const hold = 2
	release := make(chan struct{})
	var blocking sync.Map
	h := func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Block") != "" {
			blocking.Store(r.Header.Get("X-Block"), true)
			<-release
		}
		kvtest.Echo(w, r, nil)
	}
	reps := fleetOf(t, 2, h)
	k := kvtest.Start(t, reps, cacheAware, kvtest.WithCacheAware(func(c *router.CacheAwareConfig) { c.BoundFloor, c.Lambda = 0, lambda }))
	prompt := chatJSON([]msg{{"user", words("hot", 3000)}})

	resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt, nil)
	holder := resp.Header.Get("X-Kvroute-Backend")
	var wg sync.WaitGroup
	for i := 0; i < hold; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			resp, _ := postJSON(t, k.URL+"/v1/chat/completions", prompt, map[string]string{"X-Block": fmt.Sprint(i)})
			if got := resp.Header.Get("X-Kvroute-Backend"); got != holder {
				t.Errorf("blocked request %d went to %s, not the holder %s", i, got, holder)
			}
		}(i)
		kvtest.WaitFor(t, 2*time.Second, "blocked request", func() bool { _, ok := blocking.Load(fmt.Sprint(i)); return ok })
	}
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", prompt, nil)
	second := resp.Header.Get("X-Kvroute-Backend")
	route := resp.Header.Get("X-Kvroute-Route")
	close(release)
	wg.Wait()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %s", resp.StatusCode, body)
	}
	if !sheds {
		if second != holder || !strings.HasPrefix(route, "cache_hit") {
			t.Fatalf("holder %s one past its bound: request went to %s (%s), want the holder, its match paying", holder, second, route)
		}
		return
	}
	if second == holder || !strings.HasPrefix(route, "overflow") {
		t.Fatalf("overloaded holder %s: request went to %s (%s), want the other replica by overflow", holder, second, route)
	}
	// The second replica is now recorded as a holder: with loads even again,
	// the prefix matches on it.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, k.Admin+"/debug/route", strings.NewReader(prompt))
	dr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = dr.Body.Close() }()
	var explain struct {
		Scores []struct {
			Replica string `json:"replica"`
			Matched int    `json:"matched_tokens"`
		} `json:"scores"`
	}
	if err := json.NewDecoder(dr.Body).Decode(&explain); err != nil {
		t.Fatal(err)
	}
	matched := map[string]int{}
	for _, s := range explain.Scores {
		matched[s.Replica] = s.Matched
	}
	if matched[holder] < 2000 || matched[second] < 2000 {
		t.Errorf("after overflow, holders' matches = %v; want both %s and %s to hold the prefix", matched, holder, second)
	}
}

func TestSessionMovesWhenEjectedThenStays(t *testing.T) {
	reps := fleetOf(t, 3, nil)
	k := kvtest.Start(t, reps, cacheAware)
	hdr := map[string]string{"X-Session-ID": "sess-1"}
	short := chatJSON([]msg{{"user", "hi"}})
	resp, _ := postJSON(t, k.URL+"/v1/chat/completions", short, hdr)
	first := resp.Header.Get("X-Kvroute-Backend")
	for i := 0; i < 3; i++ {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", chatJSON([]msg{{"user", fmt.Sprint("other ", i)}}), hdr)
		if got := resp.Header.Get("X-Kvroute-Backend"); got != first || resp.Header.Get("X-Kvroute-Route") != "session" {
			t.Fatalf("session left %s for %s (%s)", first, got, resp.Header.Get("X-Kvroute-Route"))
		}
	}
	var fr *kvtest.Replica
	for _, r := range reps {
		if r.Name == first {
			fr = r
		}
	}
	fr.Healthy.Store(false)
	rep := k.Srv.Fleet.ByName(first)
	kvtest.WaitFor(t, 3*time.Second, "ejection", func() bool { return !rep.Healthy() })
	resp, _ = postJSON(t, k.URL+"/v1/chat/completions", short, hdr)
	moved := resp.Header.Get("X-Kvroute-Backend")
	if moved == first {
		t.Fatal("session stayed on an ejected replica")
	}
	fr.Healthy.Store(true)
	kvtest.WaitFor(t, 3*time.Second, "recovery", rep.Healthy)
	for i := 0; i < 3; i++ {
		resp, _ := postJSON(t, k.URL+"/v1/chat/completions", chatJSON([]msg{{"user", fmt.Sprint("again ", i)}}), hdr)
		if got := resp.Header.Get("X-Kvroute-Backend"); got != moved {
			t.Fatalf("session did not stay on %s after moving: went to %s", moved, got)
		}
	}
}

func TestInFlightReturnsToZeroOnEveryPath(t *testing.T) {
	gone := make(chan time.Time, 8)
	streamer := kvtest.NewReplica(t, "s", sseReplica(3, 20*time.Millisecond, gone))
	failing := kvtest.NewReplica(t, "f", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	k := kvtest.Start(t, []*kvtest.Replica{streamer, failing}, cacheAware, func(c *config.Config) {
		c.Health.FailThreshold = 1000
		c.Backends = append(c.Backends, config.Backend{Name: "dead", URL: kvtest.DeadURL(t), Engine: "vllm"})
		c.Retries = 2
	})
	stream := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"%d"}]}`
	for i := 0; i < 12; i++ {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", fmt.Sprintf(stream, i), nil)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	// Cancelled mid-stream.
	for i := 0; i < 3; i++ {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions", strings.NewReader(fmt.Sprintf(stream, 100+i)))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			buf := make([]byte, 8)
			_, _ = resp.Body.Read(buf)
			_ = resp.Body.Close()
		}
	}
	for _, r := range k.Srv.Fleet.Replicas() {
		kvtest.WaitFor(t, 3*time.Second, r.Name()+" in flight zero", func() bool { return r.InFlight() == 0 })
	}
}
