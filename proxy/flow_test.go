package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/proxy"
)

// withFlow sets the flow section.
func withFlow(set func(f *config.Flow)) kvtest.Option {
	return func(c *config.Config) { set(&c.Flow) }
}

// saturate makes rep report waiting requests and waits until kvroute has
// polled it.
func saturate(t *testing.T, k *kvtest.KV, rep *kvtest.Replica, waiting int64) {
	t.Helper()
	rep.Waiting.Store(waiting)
	kvtest.WaitFor(t, 5*time.Second, "the replica's metrics polled", func() bool {
		s := k.Srv.Fleet.ByName(rep.Name).Snapshot()
		return s != nil && s.Waiting == float64(waiting)
	})
}

// asyncPost sends body to the chat path with hdr in the background; the
// answer arrives on the channel.
type answer struct {
	status int
	header http.Header
	body   string
	err    error
}

func asyncPost(ctx context.Context, url string, hdr map[string]string) <-chan answer {
	return asyncPostBody(ctx, url, kvtest.ChatBody, hdr)
}

// asyncPostBody is asyncPost of body.
func asyncPostBody(ctx context.Context, url, body string, hdr map[string]string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			out <- answer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		out <- answer{status: resp.StatusCode, header: resp.Header, body: b.String()}
	}()
	return out
}

func await(t *testing.T, c <-chan answer) answer {
	t.Helper()
	select {
	case a := <-c:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer")
	}
	return answer{}
}

// queued waits until n requests wait in kvroute's queue.
func queued(t *testing.T, k *kvtest.KV, n int) {
	t.Helper()
	kvtest.WaitFor(t, 5*time.Second, "requests queued", func() bool { return k.Srv.Proxy.FlowStats().Queue.Queued == n })
}

// While the only replica is saturated a request waits in kvroute, and
// goes once the replica reports room; the replica never sees it before.
func TestFlowQueuesWhileSaturated(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) { f.MaxWaiting = 2 }))
	saturate(t, k, r0, 5)
	got := asyncPost(t.Context(), k.URL, nil)
	queued(t, k, 1)
	if n := r0.Hits.Load(); n != 0 {
		t.Fatalf("a saturated replica got %d requests", n)
	}
	r0.Waiting.Store(0)
	if a := await(t, got); a.status != http.StatusOK {
		t.Fatalf("status %d: %s", a.status, a.body)
	}
	if n := r0.Hits.Load(); n != 1 {
		t.Fatalf("replica hits %d, want 1", n)
	}
	// The watch on the queued client ended with its request.
	kvtest.WaitFor(t, 5*time.Second, "no client watch left", func() bool { return proxy.Watching() == 0 })
}

// A request let go while one replica is saturated and another is not is
// routed among those with room: round_robin, which would alternate,
// sends every request to the replica with room.
func TestFlowKeepsRequestsOffSaturatedReplicas(t *testing.T) {
	r0, r1 := kvtest.NewReplica(t, "r0", nil), kvtest.NewReplica(t, "r1", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0, r1}, withFlow(func(f *config.Flow) { f.MaxWaiting = 2 }))
	saturate(t, k, r0, 5)
	for range 6 {
		if a := await(t, asyncPost(t.Context(), k.URL, nil)); a.status != http.StatusOK {
			t.Fatalf("status %d: %s", a.status, a.body)
		}
	}
	if r0.Hits.Load() != 0 || r1.Hits.Load() != 6 {
		t.Fatalf("hits r0 %d, r1 %d; want 0 and 6", r0.Hits.Load(), r1.Hits.Load())
	}
}

// The queue's refusals: past max_wait 503 with Retry-After; a request shed
// for a more urgent one 429; a client leaving the queue is answered 499
// and its request never reaches a replica.
func TestFlowQueueRefusals(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	core, logs := observer.New(zapcore.InfoLevel)
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) {
		f.MaxWaiting, f.MaxQueued, f.MaxWait, f.PriorityHeader = 1, 1, 300*time.Millisecond, "X-Priority"
	}))
	saturate(t, k, r0, 3)

	a := await(t, asyncPost(t.Context(), k.URL, nil))
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "queue_timeout") {
		t.Fatalf("past max_wait: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}

	low := asyncPost(t.Context(), k.URL, map[string]string{"X-Priority": "5"})
	queued(t, k, 1)
	urgent := asyncPost(t.Context(), k.URL, map[string]string{"X-Priority": "-1"})
	if a := await(t, low); a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, `"shed"`) {
		t.Fatalf("shed: %d %q %s", a.status, a.header.Get("Retry-After"), a.body)
	}
	if a := await(t, urgent); a.status != http.StatusServiceUnavailable {
		t.Fatalf("the urgent request: %d %s, want a timeout (the replica stays saturated)", a.status, a.body)
	}

	ctx, cancel := context.WithCancel(t.Context())
	gone := asyncPost(ctx, k.URL, nil)
	queued(t, k, 1)
	cancel()
	<-gone
	queued(t, k, 0)
	kvtest.WaitFor(t, 5*time.Second, "the 499 line", func() bool {
		for _, e := range logs.FilterMessage("request").All() {
			if e.ContextMap()["status"] == int64(499) {
				return true
			}
		}
		return false
	})
	if n := r0.Hits.Load(); n != 0 {
		t.Fatalf("the saturated replica got %d requests", n)
	}
	refused := k.Srv.Proxy.FlowStats().Refused
	if refused["queue_timeout"] != 2 || refused["shed"] != 1 {
		t.Errorf("refusals %v, want 2 queue_timeout and 1 shed", refused)
	}
}

// A tenant past its rate gets 429 with Retry-After, the limit named;
// another tenant is not held back by it.
func TestFlowTenantRate(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) {
		f.Tenant = "header:X-Tenant"
		f.TenantLimits.Rate = 0.5
	}))
	a := map[string]string{"X-Tenant": "a"}
	if got := await(t, asyncPost(t.Context(), k.URL, a)); got.status != http.StatusOK {
		t.Fatalf("first: %d %s", got.status, got.body)
	}
	got := await(t, asyncPost(t.Context(), k.URL, a))
	if got.status != http.StatusTooManyRequests || got.header.Get("Retry-After") != "2" || !strings.Contains(got.body, "tenant_limit_rate") ||
		!strings.Contains(got.body, "flow.tenant_limits.rate") {
		t.Fatalf("second of tenant a: %d Retry-After %q %s", got.status, got.header.Get("Retry-After"), got.body)
	}
	if got := await(t, asyncPost(t.Context(), k.URL, map[string]string{"X-Tenant": "b"})); got.status != http.StatusOK {
		t.Fatalf("tenant b: %d %s", got.status, got.body)
	}
	if n := k.Srv.Proxy.FlowStats().Refused["rate"]; n != 1 {
		t.Errorf("%d rate refusals counted, want 1", n)
	}
}

// A reload that changes flow control's settings keeps the requests that
// wait: the one queued before it is answered once the replica has room.
func TestFlowReloadKeepsTheQueue(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	var cfg *config.Config
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) { f.MaxWaiting = 2 }),
		func(c *config.Config) { cfg = c })
	saturate(t, k, r0, 5)
	got := asyncPost(t.Context(), k.URL, nil)
	queued(t, k, 1)
	next := *cfg
	next.Flow.MaxWaiting, next.Flow.MaxQueued, next.Flow.TenantLimits.Rate = 3, 500, 100
	if err := k.Srv.Reload(t.Context(), &next); err != nil {
		t.Fatal(err)
	}
	queued(t, k, 1)
	r0.Waiting.Store(0)
	if a := await(t, got); a.status != http.StatusOK {
		t.Fatalf("status %d: %s", a.status, a.body)
	}
}

// With tenant: api_key each API key is a tenant of its own: one key past
// its rate is refused while another key's requests go.
func TestFlowTenantByAPIKey(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0}, func(c *config.Config) {
		c.Auth.APIKeys = []string{"tenant-key-a", "tenant-key-b"}
		c.Flow.Tenant = "api_key"
		c.Flow.TenantLimits.Rate = 0.5
	})
	a := map[string]string{"Authorization": "Bearer tenant-key-a"}
	if got := await(t, asyncPost(t.Context(), k.URL, a)); got.status != http.StatusOK {
		t.Fatalf("first of key a: %d %s", got.status, got.body)
	}
	if got := await(t, asyncPost(t.Context(), k.URL, a)); got.status != http.StatusTooManyRequests {
		t.Fatalf("second of key a: %d %s, want 429", got.status, got.body)
	}
	if got := await(t, asyncPost(t.Context(), k.URL, map[string]string{"Authorization": "Bearer tenant-key-b"})); got.status != http.StatusOK {
		t.Fatalf("key b: %d %s", got.status, got.body)
	}
}

// flow.max_running bounds a replica's batch, and a tenant holding less
// than its fair share of the batches is not held back by it: with one
// replica at max_running 2, tenant a's third request waits in kvroute
// while a holds 2, but tenant b's goes at once (2 tenants: a share of 1
// each, and b holds none); a's waits until one of a's ends.
func TestFlowMaxRunningFairShare(t *testing.T) {
	hold := make(chan struct{})
	r0 := kvtest.NewReplica(t, "r0", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Tenant") == "a" {
			<-hold
		}
		kvtest.Echo(w, r, nil)
	})
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) {
		f.MaxRunning, f.Tenant = 2, "header:X-Tenant"
	}))
	kvtest.WaitFor(t, 5*time.Second, "the replica's metrics polled", func() bool {
		return k.Srv.Fleet.ByName("r0").Snapshot() != nil
	})
	a := map[string]string{"X-Tenant": "a"}
	first := []<-chan answer{asyncPost(t.Context(), k.URL, a), asyncPost(t.Context(), k.URL, a)}
	kvtest.WaitFor(t, 5*time.Second, "a's two requests at the replica", func() bool { return r0.Running.Load() == 2 })
	third := asyncPost(t.Context(), k.URL, a)
	queued(t, k, 1)
	if b := await(t, asyncPost(t.Context(), k.URL, map[string]string{"X-Tenant": "b"})); b.status != http.StatusOK {
		t.Fatalf("tenant b: status %d: %s", b.status, b.body)
	}
	if n := r0.Hits.Load(); n != 3 {
		t.Fatalf("replica hits %d, want 3: a's third must wait while a holds its share", n)
	}
	if n := k.Srv.Proxy.FlowStats().Queue.Queued; n != 1 {
		t.Fatalf("%d queued after b's request, want a's third", n)
	}
	close(hold)
	for _, c := range append(first, third) {
		if got := await(t, c); got.status != http.StatusOK {
			t.Fatalf("tenant a: status %d: %s", got.status, got.body)
		}
	}
	// Every tenant is forgotten once nothing of it is left.
	kvtest.WaitFor(t, 5*time.Second, "no tenant counted", func() bool { return proxy.ShareTenants(k.Srv.Proxy) == 0 })
}

// A tenant's request in flight counts against flow.tenant_limits.
// max_concurrent until its answer is written, streamed or read whole:
// requests one after another never pass it.
func TestFlowTenantConcurrencyReleased(t *testing.T) {
	r0 := kvtest.NewReplica(t, "r0", nil)
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) {
		f.Tenant, f.TenantLimits.MaxConcurrent = "header:X-Tenant", 1
	}))
	for i := range 5 {
		if a := await(t, asyncPost(t.Context(), k.URL, map[string]string{"X-Tenant": "a"})); a.status != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, a.status, a.body)
		}
	}
}

// Late binding keeps locality: with both replicas saturated, a queued
// request whose prefix one of them holds lets a younger request take the
// room that frees on the other, and goes to its holder once that frees;
// with flow.locality_wait 0 it takes the first room.
func TestFlowWaitsForThePrefixHolder(t *testing.T) {
	for _, wait := range []time.Duration{time.Minute, 0} {
		t.Run(wait.String(), func(t *testing.T) {
			var mu sync.Mutex
			blocks := map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{})}
			where := map[string]string{} // blocker → replica
			handler := func(name string) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					if b := r.Header.Get("X-Block"); b != "" {
						mu.Lock()
						where[b] = name
						ch := blocks[b]
						mu.Unlock()
						<-ch
					}
					kvtest.Echo(w, r, nil)
				}
			}
			reps := []*kvtest.Replica{kvtest.NewReplica(t, "r0", handler("r0")), kvtest.NewReplica(t, "r1", handler("r1"))}
			k := kvtest.Start(t, reps, func(c *config.Config) {
				c.Policy = "cache_aware"
				c.Flow.MaxRunning, c.Flow.LocalityWait = 1, wait
			})
			kvtest.WaitFor(t, 5*time.Second, "the replicas' metrics polled", func() bool {
				return k.Srv.Fleet.ByName("r0").Snapshot() != nil && k.Srv.Fleet.ByName("r1").Snapshot() != nil
			})
			shared := strings.Repeat("The fleet's long shared system prompt, which one replica holds. ", 60)
			chat := func(content string) string {
				return `{"model":"m1","messages":[{"role":"user","content":"` + content + `"}]}`
			}
			post := func(body string, hdr map[string]string) <-chan answer {
				return asyncPostBody(t.Context(), k.URL, body, hdr)
			}
			first := await(t, post(chat(shared), nil))
			holder := first.header.Get("X-Kvroute-Backend")
			b1 := post(chat("blocker one"), map[string]string{"X-Block": "1"})
			kvtest.WaitFor(t, 5*time.Second, "the first blocker", func() bool { mu.Lock(); defer mu.Unlock(); return len(where) == 1 })
			b2 := post(chat("blocker two"), map[string]string{"X-Block": "2"})
			kvtest.WaitFor(t, 5*time.Second, "both blockers", func() bool { mu.Lock(); defer mu.Unlock(); return len(where) == 2 })
			mu.Lock()
			onHolder, onOther := "1", "2"
			if where["1"] != holder {
				onHolder, onOther = "2", "1"
			}
			mu.Unlock()
			a := post(chat(shared+" And one more question."), nil)
			queued(t, k, 1)
			b := post(chat("An unrelated short question."), nil)
			queued(t, k, 2)
			close(blocks[onOther]) // room frees on the replica without the prefix
			if wait > 0 {
				got := await(t, b)
				if got.header.Get("X-Kvroute-Backend") == holder {
					t.Fatalf("the unrelated request went to the holder")
				}
				queued(t, k, 1) // a waits for its holder
				close(blocks[onHolder])
				if got := await(t, a); got.header.Get("X-Kvroute-Backend") != holder {
					t.Errorf("the request with the prefix went to %s, want its holder %s", got.header.Get("X-Kvroute-Backend"), holder)
				}
			} else {
				got := await(t, a)
				if got.header.Get("X-Kvroute-Backend") == holder {
					t.Errorf("without locality_wait the oldest request went to the holder, not the first room")
				}
				close(blocks[onHolder])
				await(t, b)
			}
			await(t, b1)
			await(t, b2)
		})
	}
}

// engineStream answers as an engine streaming a chat: a request that
// prefills(r) waits for prefilled before its first event (its prompt
// prefilling), one that decodes(r) waits for done after it before the
// stream ends (decoding).
func engineStream(prefilled, done <-chan struct{}, prefills, decodes func(*http.Request) bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if prefills(r) {
			select {
			case <-prefilled:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"x"}}]}`+"\n\n")
		if decodes(r) {
			w.(http.Flusher).Flush()
			select {
			case <-done:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// always is a predicate of engineStream that holds for every request.
func always(*http.Request) bool { return true }

// A tenant at or over its fair share while another tenant is active is
// kept off a replica while a prompt sent there is prefilling (no first
// byte back yet): its prompts never share an engine step's prefill with
// another tenant's. Once the prompts there are prefilled (their streams'
// first events out) it goes, its requests still in flight.
func TestFlowOverShareWaitsForPrefill(t *testing.T) {
	prefilled, done := make(chan struct{}), make(chan struct{})
	engine := engineStream(prefilled, done, always, always)
	r0 := kvtest.NewReplica(t, "r0", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Third") != "" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		engine(w, r)
	})
	// cache_aware counts each replica's prompts not yet prefilled.
	k := kvtest.Start(t, []*kvtest.Replica{r0}, withFlow(func(f *config.Flow) {
		f.MaxRunning, f.Tenant = 4, "header:X-Tenant"
	}), func(c *config.Config) { c.Policy = "cache_aware" })
	kvtest.WaitFor(t, 5*time.Second, "the replica's metrics polled", func() bool {
		return k.Srv.Fleet.ByName("r0").Snapshot() != nil
	})
	stream := func(hdr map[string]string, n string) <-chan answer {
		return asyncPostBody(t.Context(), k.URL, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"`+n+`"}]}`, hdr)
	}
	a, b := map[string]string{"X-Tenant": "a"}, map[string]string{"X-Tenant": "b"}
	// Two tenants active, a share of 4/2 = 2 each: a's two requests
	// and b's one are at the replica, prefilling.
	first := make([]<-chan answer, 0, 3)
	first = append(first, stream(a, "a1"), stream(a, "a2"))
	kvtest.WaitFor(t, 5*time.Second, "a's two requests at the replica", func() bool { return r0.Hits.Load() == 2 })
	first = append(first, stream(b, "b1"))
	kvtest.WaitFor(t, 5*time.Second, "b's request at the replica", func() bool { return r0.Hits.Load() == 3 })
	// a's third, over its share, finds room in the batch (3 of 4) but
	// prompts prefilling: it waits.
	third := stream(map[string]string{"X-Tenant": "a", "X-Third": "1"}, "third")
	queued(t, k, 1)
	if n := r0.Hits.Load(); n != 3 {
		t.Fatalf("replica hits %d while prompts prefill, want 3", n)
	}
	close(prefilled)
	kvtest.WaitFor(t, 5*time.Second, "a's third at the replica once the prompts are prefilled", func() bool { return r0.Hits.Load() == 4 })
	if got := await(t, third); got.status != http.StatusOK {
		t.Fatalf("a's third: status %d: %s", got.status, got.body)
	}
	close(done)
	for _, c := range first {
		if got := await(t, c); got.status != http.StatusOK {
			t.Fatalf("status %d: %s", got.status, got.body)
		}
	}
}

// While a tenant under its share is active, one over its share does not
// take the last replica with no prompt prefilling: the under-share
// tenant's next prompt finds one where it prefills alone.
func TestFlowOverShareKeepsOneReplicaClean(t *testing.T) {
	prefilled, done := make(chan struct{}), make(chan struct{})
	var chats atomic.Int64 // chat requests the replicas received
	engine := engineStream(prefilled, done, func(r *http.Request) bool { return r.Header.Get("X-Tenant") == "b" }, always)
	handler := func(w http.ResponseWriter, r *http.Request) {
		chats.Add(1)
		engine(w, r)
	}
	reps := []*kvtest.Replica{kvtest.NewReplica(t, "r0", handler), kvtest.NewReplica(t, "r1", handler)}
	k := kvtest.Start(t, reps, withFlow(func(f *config.Flow) {
		f.MaxRunning, f.Tenant = 4, "header:X-Tenant"
	}), func(c *config.Config) { c.Policy = "cache_aware" })
	kvtest.WaitFor(t, 5*time.Second, "the replicas' metrics polled", func() bool {
		return k.Srv.Fleet.ByName("r0").Snapshot() != nil && k.Srv.Fleet.ByName("r1").Snapshot() != nil
	})
	stream := func(tenant, n string) <-chan answer {
		return asyncPostBody(t.Context(), k.URL, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"`+n+`"}]}`,
			map[string]string{"X-Tenant": tenant})
	}
	var all []<-chan answer
	// a alone: four requests, prefilled at once and decoding.
	for i := range 4 {
		all = append(all, stream("a", fmt.Sprint("a", i)))
		kvtest.WaitFor(t, 5*time.Second, "a's request decoding", func() bool { return chats.Load() == int64(i+1) })
	}
	kvtest.WaitFor(t, 5*time.Second, "a's prompts prefilled", func() bool {
		v := k.Srv.Router.Index().View(time.Now())
		return v.Pending(k.Srv.Fleet.ByName("r0")) == 0 && v.Pending(k.Srv.Fleet.ByName("r1")) == 0
	})
	// b joins (a share of 4 × 2 / 2 = 4 each: a at its share, b under):
	// b's prompt prefills on one replica.
	all = append(all, stream("b", "b1"))
	kvtest.WaitFor(t, 5*time.Second, "b's request at a replica", func() bool { return chats.Load() == 5 })
	// a's fifth would find the other replica with room and nothing
	// prefilling, the last such: it waits.
	fifth := stream("a", "a5")
	queued(t, k, 1)
	if n := chats.Load(); n != 5 {
		t.Fatalf("replicas received %d chats while b's prompt prefills, want 5", n)
	}
	close(prefilled)
	kvtest.WaitFor(t, 5*time.Second, "a's fifth at a replica once b's prompt is prefilled", func() bool { return chats.Load() == 6 })
	close(done)
	for _, c := range append(all, fifth) {
		if got := await(t, c); got.status != http.StatusOK {
			t.Fatalf("status %d: %s", got.status, got.body)
		}
	}
}

// A tenant under its share, while another is active, goes to a replica
// with room where no other prompt is prefilling, rather than wait for that
// prefill's step where the policy alone would send it.
func TestFlowUnderShareAvoidsPrefill(t *testing.T) {
	prefilled, done := make(chan struct{}), make(chan struct{})
	var chats [2]atomic.Int64 // chat requests r0 and r1 received
	a := func(r *http.Request) bool { return r.Header.Get("X-Tenant") == "a" }
	engine := engineStream(prefilled, done, func(r *http.Request) bool { return a(r) && r.Header.Get("X-Prefilled") == "" }, a)
	handler := func(i int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			chats[i].Add(1)
			engine(w, r)
		}
	}
	r0, r1 := kvtest.NewReplica(t, "r0", handler(0)), kvtest.NewReplica(t, "r1", handler(1))
	k := kvtest.Start(t, []*kvtest.Replica{r0, r1}, withFlow(func(f *config.Flow) {
		f.MaxRunning, f.MaxWaiting, f.Tenant = 4, 10, "header:X-Tenant"
	}), func(c *config.Config) { c.Policy = "cache_aware" })
	stream := func(hdr map[string]string, content string) <-chan answer {
		return asyncPostBody(t.Context(), k.URL, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"`+content+`"}]}`, hdr)
	}
	// Two of a's requests decoding on r1 (r0 saturated meanwhile), then
	// one of its prompts prefilling on r0, the less loaded.
	saturate(t, k, r0, 20)
	var as []<-chan answer
	for i := range 2 {
		as = append(as, stream(map[string]string{"X-Tenant": "a", "X-Prefilled": "1"}, strings.Repeat(fmt.Sprint("decoding ", i, " "), 150)))
		kvtest.WaitFor(t, 5*time.Second, "a's request decoding on r1", func() bool { return chats[1].Load() == int64(i+1) })
	}
	kvtest.WaitFor(t, 5*time.Second, "a's prompts on r1 prefilled", func() bool {
		v := k.Srv.Router.Index().View(time.Now())
		return v.Pending(k.Srv.Fleet.ByName("r1")) == 0
	})
	// r1's engine reports a queue: without flow control's preference
	// its price sends b to r0.
	saturate(t, k, r1, 5)
	saturate(t, k, r0, 0)
	as = append(as, stream(map[string]string{"X-Tenant": "a"}, strings.Repeat("a long prompt ", 200)))
	kvtest.WaitFor(t, 5*time.Second, "a's prompt at r0", func() bool { return chats[0].Load() == 1 })
	// b, under its share: r0 has the lesser load, r1 nothing prefilling.
	if got := await(t, stream(map[string]string{"X-Tenant": "b"}, "b")); got.status != http.StatusOK {
		t.Fatalf("b: status %d: %s", got.status, got.body)
	}
	if c0, c1 := chats[0].Load(), chats[1].Load(); c0 != 1 || c1 != 3 {
		t.Fatalf("chats r0 %d, r1 %d: b's request must go to r1, where nothing prefills", c0, c1)
	}
	close(prefilled)
	close(done)
	for _, c := range as {
		if got := await(t, c); got.status != http.StatusOK {
			t.Fatalf("a: status %d: %s", got.status, got.body)
		}
	}
}
