package proxy_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

const heldStreamBody = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hold"}]}`

// holder ends the held streams of the replicas it was given to.
type holder struct {
	release chan struct{}
	once    sync.Once
}

func newHolder() *holder { return &holder{release: make(chan struct{})} }

func (h *holder) free() { h.once.Do(func() { close(h.release) }) }

// holdingReplica streams one event to a request with X-Test-Hold set and
// then holds the stream (and kvroute's connection to it) open until h is
// freed or kvroute goes away; other requests get kvtest.Echo at once.
func holdingReplica(h *holder) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test-Hold") == "" {
			kvtest.Echo(w, r, nil)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprint(w, "data: {\"held\":true}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-h.release:
		case <-r.Context().Done():
			return
		}
		_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// holdStream sends a held stream through kvroute and returns once its
// first event arrived. The stream stays open until the test ends or its
// replica's holder is freed.
func holdStream(t *testing.T, url string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", strings.NewReader(heldStreamBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Test-Hold", "1")
	tr := &http.Transport{DisableKeepAlives: true}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close(); tr.CloseIdleConnections() })
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("held stream: status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "text/event-stream") {
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("held stream: first line %q, %v", line, err)
		}
	}
}

// ejectionsMetric scrapes kvroute_backend_ejections_total from the admin
// /metrics, by backend.
func ejectionsMetric(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	resp, err := httpGet(t, admin+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("admin /metrics does not parse: %v", err)
	}
	out := map[string]float64{}
	f := fams["kvroute_backend_ejections_total"]
	if f == nil {
		t.Fatal("no kvroute_backend_ejections_total in /metrics")
	}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "backend" {
				out[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// assertUncounted fails unless no failure was counted against any of reps.
func assertUncounted(t *testing.T, k *kvtest.KV, names ...string) {
	t.Helper()
	ej := ejectionsMetric(t, k.Admin)
	for _, name := range names {
		r := k.Srv.Fleet.ByName(name)
		if !r.Healthy() || r.Ejections() != 0 || r.ConsecutiveFailures() != 0 || r.LastError() != "" {
			t.Errorf("replica %s: healthy %v, ejections %d, consecutive failures %d, last error %q; want healthy, 0, 0, none",
				name, r.Healthy(), r.Ejections(), r.ConsecutiveFailures(), r.LastError())
		}
		if v, ok := ej[name]; !ok || v != 0 {
			t.Errorf("kvroute_backend_ejections_total{backend=%q} = %v (present %v), want 0", name, v, ok)
		}
	}
}

func smallPools(wait time.Duration) kvtest.Option {
	return func(c *config.Config) {
		c.Limits.MaxConnsPerReplica = 2
		c.Limits.ConnWait = wait
		c.Timeouts.StreamIdle = time.Minute // held streams stay silent
	}
}

// With every replica's pool full of held streams, normal requests get 503
// with Retry-After and an OpenAI error once limits.conn_wait is over, and
// no replica is counted as failing: none is ejected, so the fleet serves
// again as soon as the streams end.
func TestFullPoolsGet503AndNoEjection(t *testing.T) {
	h := newHolder()
	defer h.free()
	a := kvtest.NewReplica(t, "a", holdingReplica(h))
	b := kvtest.NewReplica(t, "b", holdingReplica(h))
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, smallPools(50*time.Millisecond))
	ra, rb := k.Srv.Fleet.ByName("a"), k.Srv.Fleet.ByName("b")
	for range 4 {
		holdStream(t, k.URL)
	}
	if ra.InFlight() != 2 || rb.InFlight() != 2 {
		t.Fatalf("in flight a %d, b %d; want both pools (2 each) full", ra.InFlight(), rb.InFlight())
	}

	for i := range 8 { // four times the fail threshold of 2
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("request %d: status %d %s, want 503", i, resp.StatusCode, body)
		}
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("request %d: 503 without Retry-After", i)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("request %d: Content-Type %q", i, ct)
		}
		assertOpenAIError(t, body, "replica_busy")
	}
	assertUncounted(t, k, "a", "b")

	h.free()
	kvtest.WaitFor(t, 5*time.Second, "held streams to end", func() bool { return ra.InFlight()+rb.InFlight() == 0 })
	for i := range 4 {
		if resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d after the streams ended: %d %s", i, resp.StatusCode, body)
		}
	}
	assertUncounted(t, k, "a", "b")
}

// A request that finds every pool full waits, up to limits.conn_wait, for a
// connection, and is served on the one freed meanwhile.
func TestRequestWaitsForAFreedConnection(t *testing.T) {
	ha, hb := newHolder(), newHolder()
	defer ha.free()
	defer hb.free()
	a := kvtest.NewReplica(t, "a", holdingReplica(ha))
	b := kvtest.NewReplica(t, "b", holdingReplica(hb))
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, smallPools(30*time.Second)) // a bound, never reached
	ra, rb := k.Srv.Fleet.ByName("a"), k.Srv.Fleet.ByName("b")
	for range 4 {
		holdStream(t, k.URL)
	}

	type answer struct {
		status  int
		backend string
		body    []byte
	}
	done := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions", strings.NewReader(kvtest.ChatBody))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{body: []byte(err.Error())}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		var sb strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&sb)
		done <- answer{resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), []byte(sb.String())}
	}()
	// The request is waiting for a connection of one replica: its third
	// request in flight.
	kvtest.WaitFor(t, 10*time.Second, "the request to wait for a connection", func() bool {
		return ra.InFlight()+rb.InFlight() == 5
	})
	waitingOn, free := "a", ha.free
	if rb.InFlight() == 3 {
		waitingOn, free = "b", hb.free
	}
	free()
	got := <-done
	if got.status != http.StatusOK || got.backend != waitingOn {
		t.Fatalf("status %d from %q (%s), want 200 from %s", got.status, got.backend, got.body, waitingOn)
	}
	assertUncounted(t, k, "a", "b")
}

// A replica whose pool is full is passed over while another has a free
// connection: no request waits for it or is even sent to it.
func TestFullPoolIsPassedOver(t *testing.T) {
	h := newHolder()
	defer h.free()
	a := kvtest.NewReplica(t, "a", holdingReplica(h))
	b := kvtest.NewReplica(t, "b", nil) // answers every request at once
	k := kvtest.Start(t, []*kvtest.Replica{a, b}, smallPools(30*time.Second))
	ra := k.Srv.Fleet.ByName("a")
	for i := 0; ra.InFlight() < 2; i++ {
		if i == 10 {
			t.Fatalf("a holds %d streams after 10 tries", ra.InFlight())
		}
		holdStream(t, k.URL)
	}
	sent := ra.Dispatched()
	for i := range 6 {
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvroute-Backend") != "b" {
			t.Fatalf("request %d: %d from %q (%s), want 200 from b", i, resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body)
		}
	}
	if n := ra.Dispatched() - sent; n != 0 {
		t.Errorf("%d requests were sent to the full replica a", n)
	}
	assertUncounted(t, k, "a", "b")
}

// A client that goes away, mid-stream or before its answer came, is never
// counted against the replica, however often it happens.
func TestClientGoneIsNotAReplicaFailure(t *testing.T) {
	cases := []struct {
		name    string
		handler http.HandlerFunc
		body    string
		wait    func(br *bufio.Reader) // what the client reads before it hangs up
	}{
		{"mid-stream", sseReplica(1000, 20*time.Millisecond, nil),
			`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			func(br *bufio.Reader) {
				for {
					line, err := br.ReadString('\n')
					if err != nil || strings.Contains(line, `"i":1`) {
						return
					}
				}
			}},
		{"before the answer", func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(100 * time.Millisecond)
			kvtest.Echo(w, r, nil)
		}, kvtest.ChatBody, func(*bufio.Reader) {}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := kvtest.NewReplica(t, "a", c.handler)
			k := kvtest.Start(t, []*kvtest.Replica{a})
			ra := k.Srv.Fleet.ByName("a")
			for range 5 { // past the fail threshold of 2
				conn := dialTCP(t, strings.TrimPrefix(k.URL, "http://"))
				_, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
					len(c.body), c.body)
				if err != nil {
					t.Fatal(err)
				}
				_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				c.wait(bufio.NewReader(conn))
				_ = conn.Close()
				kvtest.WaitFor(t, 5*time.Second, "the request to settle", func() bool { return ra.InFlight() == 0 })
			}
			assertUncounted(t, k, "a")
		})
	}
}

// The replica's own faults still count: a refused connection, a 5xx, a
// stream the replica broke off.
func TestReplicaFaultsStillCount(t *testing.T) {
	cases := []struct {
		name    string
		dead    bool
		handler http.HandlerFunc
		body    string
	}{
		{"connection refused", true, nil, kvtest.ChatBody},
		{"5xx", false, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }, kvtest.ChatBody},
		{"stream broken off", false, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = fmt.Fprint(w, "data: {\"i\":0}\n\n")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // closes the connection mid-body
		}, heldStreamBody},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := kvtest.NewReplica(t, "a", c.handler)
			k := kvtest.Start(t, []*kvtest.Replica{a}, func(cfg *config.Config) {
				cfg.Retries = 0
				cfg.Health = config.Health{Interval: time.Hour, Timeout: 500 * time.Millisecond, FailThreshold: 10}
				if c.dead {
					cfg.Backends[0].URL = kvtest.DeadURL(t)
				}
			})
			r := k.Srv.Fleet.ByName("a")
			// Two health checks run at start: kvtest.Start's, done by now,
			// and the health loop's first, in its own time; the next is an
			// hour away. They count in a streak of their own, and a passing
			// one returning the replica to service would start the
			// requests' streak over: the request's failure is counted
			// after both.
			if c.dead {
				kvtest.WaitFor(t, 5*time.Second, "the health checks at start", func() bool { return r.ConsecutiveFailures() >= 2 })
			} else {
				// kvroute lists the models once a health check has passed.
				kvtest.WaitFor(t, 5*time.Second, "the health checks at start", func() bool { return a.ModelLists.Load() >= 2 })
			}
			before := r.FailedRequests()
			resp, body := postJSON(t, k.URL+"/v1/chat/completions", c.body, nil)
			kvtest.WaitFor(t, 5*time.Second, "the request to settle", func() bool { return r.InFlight() == 0 })
			if n := r.FailedRequests() - before; n != 1 {
				t.Errorf("status %d (%s): %d failures counted, want 1", resp.StatusCode, body, n)
			}
			if r.LastError() == "" {
				t.Error("no last error recorded")
			}
		})
	}
}
