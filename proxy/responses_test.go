package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// responsesEngine stands in for a vLLM replica's Responses API: it keeps
// the responses it made in its own memory and answers 404 for any other
// id, as vLLM does.
type responsesEngine struct {
	name   string
	rep    *kvtest.Replica // its server, which read the request body
	mu     sync.Mutex
	stored map[string]bool
	n      int
	broken atomic.Bool  // drop the connection of every request on an id
	status atomic.Int32 // when set, the status of every request on an id
}

func newResponsesEngine(name string) *responsesEngine {
	return &responsesEngine{name: name, stored: map[string]bool{}}
}

func (e *responsesEngine) has(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stored[id]
}

func notFound(w http.ResponseWriter, id string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","code":404}}`, id)
}

func (e *responsesEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if path == "/v1/responses" && r.Method == http.MethodPost {
		e.create(w, r)
		return
	}
	rest, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		kvtest.Echo(w, r, nil)
		return
	}
	if e.broken.Load() {
		if hj, ok := w.(http.Hijacker); ok {
			if c, _, err := hj.Hijack(); err == nil {
				_ = c.Close()
			}
		}
		return
	}
	if s := e.status.Load(); s != 0 {
		w.WriteHeader(int(s))
		_, _ = fmt.Fprintf(w, `{"error":{"message":"%s says %d","type":"server_error"}}`, e.name, s)
		return
	}
	id, sub, _ := strings.Cut(rest, "/")
	if !e.has(id) {
		notFound(w, id)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && sub == "":
		_, _ = fmt.Fprintf(w, `{"id":%q,"object":"response","status":"completed","replica":%q}`, id, e.name)
	case r.Method == http.MethodDelete && sub == "":
		e.mu.Lock()
		delete(e.stored, id)
		e.mu.Unlock()
		_, _ = fmt.Fprintf(w, `{"id":%q,"object":"response","deleted":true}`, id)
	case r.Method == http.MethodPost && sub == "cancel":
		_, _ = fmt.Fprintf(w, `{"id":%q,"object":"response","status":"cancelled"}`, id)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (e *responsesEngine) create(w http.ResponseWriter, _ *http.Request) {
	var req struct {
		Stream   bool   `json:"stream"`
		Previous string `json:"previous_response_id"`
	}
	// The fake replica read the body before calling the handler; the tests
	// send one request at a time.
	_, body := e.rep.LastRequest()
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if req.Previous != "" && !e.has(req.Previous) {
		notFound(w, req.Previous)
		return
	}
	e.mu.Lock()
	e.n++
	id := fmt.Sprintf("resp_%s_%03d", e.name, e.n)
	e.stored[id] = true
	e.mu.Unlock()
	if !req.Stream {
		// Nested ids come before the response's own.
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"object":"response","output":[{"id":"msg_%s","type":"message","content":[{"type":"output_text","text":"hi"}]}],"id":%q,"status":"completed"}`, id, id)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	// response.created cut into pieces across flushes, mid-line and mid-id.
	created := fmt.Sprintf("event: response.created\ndata: {\"response\":{\"id\":%q,\"object\":\"response\",\"status\":\"in_progress\",\"instructions\":%q},\"sequence_number\":0,\"type\":\"response.created\"}\n\n",
		id, strings.Repeat("be brief. ", 300))
	for _, piece := range []string{created[:15], created[15:40], created[40:]} {
		_, _ = io.WriteString(w, piece)
		fl.Flush()
		time.Sleep(5 * time.Millisecond)
	}
	_, _ = fmt.Fprintf(w, "event: response.output_item.added\ndata: {\"item\":{\"id\":\"msg_x\",\"type\":\"message\"},\"type\":\"response.output_item.added\"}\n\n")
	_, _ = fmt.Fprintf(w, "event: response.completed\ndata: {\"response\":{\"id\":%q,\"status\":\"completed\"},\"type\":\"response.completed\"}\n\n", id)
	fl.Flush()
}

// responsesFleet starts two replicas, r0 and r1, answering the Responses
// API.
func responsesFleet(t *testing.T) ([]*kvtest.Replica, []*responsesEngine) {
	var reps []*kvtest.Replica
	var engines []*responsesEngine
	for i := 0; i < 2; i++ {
		e := newResponsesEngine(fmt.Sprintf("r%d", i))
		engines = append(engines, e)
		e.rep = kvtest.NewReplica(t, e.name, e.ServeHTTP)
		reps = append(reps, e.rep)
	}
	return reps, engines
}

// do sends a request (a JSON body unless body is empty) with the test's
// context and reads and closes the answer's body.
//
//bodyclose:handled
func do(t *testing.T, method, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// createResponse posts a new response (streamed or not) and returns its id
// as the client read it and the replica that answered.
func createResponse(t *testing.T, url string, stream bool, previous string) (id, replica string, status int) {
	t.Helper()
	body := map[string]any{"model": "m1", "input": "hello", "stream": stream}
	if previous != "" {
		body["previous_response_id"] = previous
	}
	b, _ := json.Marshal(body)
	resp, raw := do(t, http.MethodPost, url+"/v1/responses", string(b))
	replica = resp.Header.Get("X-Kvroute-Backend")
	if resp.StatusCode != 200 {
		return "", replica, resp.StatusCode
	}
	if !stream {
		var v struct{ ID string }
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("answer %s: %v", raw, err)
		}
		return v.ID, replica, 200
	}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ev struct {
				Type     string
				Response struct{ ID string }
			}
			if json.Unmarshal([]byte(data), &ev) == nil && ev.Type == "response.created" {
				return ev.Response.ID, replica, 200
			}
		}
	}
	t.Fatalf("no response.created in %q", raw)
	return "", "", 0
}

// createOn creates responses until one is on replica want, and returns its id.
func createOn(t *testing.T, url, want string) string {
	t.Helper()
	for i := 0; i < 20; i++ {
		id, rep, status := createResponse(t, url, false, "")
		if status != 200 {
			t.Fatalf("create: %d", status)
		}
		if rep == want {
			return id
		}
	}
	t.Fatalf("no response created on %s", want)
	return ""
}

func TestResponsesFollowUpsGoToTheProducer(t *testing.T) {
	for _, policy := range []string{"round_robin", "cache_aware"} {
		t.Run(policy, func(t *testing.T) {
			reps, engines := responsesFleet(t)
			k := kvtest.Start(t, reps, func(c *config.Config) { c.Policy = policy })
			// Several ids, JSON and streamed, over both replicas.
			// (cache_aware places these short prompts by load, ties at
			// random: make more until both replicas hold some.)
			producer := map[string]string{}
			used := map[string]int{}
			for i := 0; len(producer) < 8 || len(used) < 2; i++ {
				if i == 100 {
					t.Fatalf("the policy put every response on one replica (%v)", used)
				}
				id, rep, status := createResponse(t, k.URL, i%2 == 1, "")
				if status != 200 || !strings.HasPrefix(id, "resp_"+rep+"_") {
					t.Fatalf("create %d: %d, id %q from %s", i, status, id, rep)
				}
				producer[id] = rep
				used[rep]++
			}
			for id, want := range producer {
				for try := 0; try < 4; try++ {
					// A follow-up, alternately streamed: its own new id is
					// recorded too.
					next, got, status := createResponse(t, k.URL, try%2 == 0, id)
					if status != 200 || got != want {
						t.Fatalf("follow-up %d of %s went to %s (%d), want %s", try, id, got, status, want)
					}
					if n2, got2, st := createResponse(t, k.URL, false, next); st != 200 || got2 != want {
						t.Fatalf("follow-up of the follow-up %s went to %s (%d), want %s (id %s)", next, got2, st, want, n2)
					}
					resp, body := do(t, http.MethodGet, k.URL+"/v1/responses/"+id, "")
					if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Backend") != want || resp.Header.Get("X-Kvroute-Route") != "response_affinity" {
						t.Fatalf("GET %s: %d from %s (%s) %s, want %s", id, resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"),
							resp.Header.Get("X-Kvroute-Route"), body, want)
					}
				}
				resp, body := do(t, http.MethodPost, k.URL+"/v1/responses/"+id+"/cancel", "")
				if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Backend") != want {
					t.Fatalf("cancel %s: %d from %s %s, want %s", id, resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body, want)
				}
				resp, body = do(t, http.MethodDelete, k.URL+"/v1/responses/"+id, "")
				if resp.StatusCode != 200 || resp.Header.Get("X-Kvroute-Backend") != want {
					t.Fatalf("DELETE %s: %d from %s %s, want %s", id, resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"), body, want)
				}
				// Deleted: kvroute forgets it, and no replica has it.
				if rep := k.Srv.Router.Responses().Lookup(id); rep != nil {
					t.Fatalf("deleted %s still pinned to %s", id, rep.Name())
				}
				if resp, _ := do(t, http.MethodGet, k.URL+"/v1/responses/"+id, ""); resp.StatusCode != 404 || resp.Header.Get("X-Kvroute-Route") == "response_affinity" {
					t.Fatalf("GET of deleted %s: %d (%s)", id, resp.StatusCode, resp.Header.Get("X-Kvroute-Route"))
				}
			}
			for _, e := range engines {
				e.mu.Lock()
				n := e.n
				e.mu.Unlock()
				if n == 0 {
					t.Errorf("%s made no response", e.name)
				}
			}
		})
	}
}

func TestUnknownResponseIDRoutedByPolicy(t *testing.T) {
	reps, _ := responsesFleet(t)
	k := kvtest.Start(t, reps) // round_robin
	before := []int64{reps[0].Hits.Load(), reps[1].Hits.Load()}
	for i := 0; i < 6; i++ {
		resp, body := do(t, http.MethodGet, k.URL+"/v1/responses/resp_nowhere", "")
		if resp.StatusCode != 404 || resp.Header.Get("X-Kvroute-Route") != "passthrough" {
			t.Fatalf("GET of an unknown id: %d (%s) %s", resp.StatusCode, resp.Header.Get("X-Kvroute-Route"), body)
		}
		_, rep, status := createResponse(t, k.URL, false, "resp_nowhere")
		if status != 404 || rep == "" {
			t.Fatalf("follow-up of an unknown id: %d from %q, want the engine's 404", status, rep)
		}
	}
	for i, r := range reps {
		if n := r.Hits.Load() - before[i]; n != 6 {
			t.Errorf("%s got %d of the 12 requests on unknown ids, want 6 (spread by the policy)", r.Name, n)
		}
	}
	// An id longer than the table keeps is routed by policy too, not refused.
	long := "resp_" + strings.Repeat("x", 300)
	if resp, _ := do(t, http.MethodGet, k.URL+"/v1/responses/"+long, ""); resp.StatusCode != 404 {
		t.Errorf("GET of a long unknown id: %d", resp.StatusCode)
	}
}

func TestPinnedReplicaFailureIsNotRetriedElsewhere(t *testing.T) {
	reps, engines := responsesFleet(t)
	k := kvtest.Start(t, reps, func(c *config.Config) {
		c.Retries = 2
		c.Health.FailThreshold = 100 // the failures below must not eject r0
	})
	id := createOn(t, k.URL, "r0")
	other := reps[1].Hits.Load()

	engines[0].broken.Store(true)
	for _, req := range []struct{ method, path string }{
		{http.MethodGet, "/v1/responses/" + id}, {http.MethodDelete, "/v1/responses/" + id}, {http.MethodPost, "/v1/responses/" + id + "/cancel"},
	} {
		resp, body := do(t, req.method, k.URL+req.path, "")
		if resp.StatusCode != 502 || !strings.Contains(string(body), "replica_unreachable") {
			t.Errorf("%s %s on a failing pinned replica: %d %s, want its 502", req.method, req.path, resp.StatusCode, body)
		}
	}
	engines[0].broken.Store(false)

	engines[0].status.Store(503)
	resp, body := do(t, http.MethodGet, k.URL+"/v1/responses/"+id, "")
	if resp.StatusCode != 503 || !strings.Contains(string(body), "r0 says 503") {
		t.Errorf("GET on a pinned replica answering 503: %d %s, want its own answer", resp.StatusCode, body)
	}
	engines[0].status.Store(0)

	if n := reps[1].Hits.Load() - other; n != 0 {
		t.Errorf("%d requests on r0's id were retried on r1", n)
	}
	if rep := k.Srv.Router.Responses().Lookup(id); rep == nil || rep.Name() != "r0" {
		t.Errorf("after failures the id is pinned to %v, want r0", rep)
	}
}

func TestFollowUpOfAnEjectedReplicaRoutedByPolicy(t *testing.T) {
	reps, _ := responsesFleet(t)
	k := kvtest.Start(t, reps)
	id := createOn(t, k.URL, "r0")
	reps[0].Healthy.Store(false)
	kvtest.WaitFor(t, 5*time.Second, "r0 ejected", func() bool {
		for _, r := range k.Srv.Fleet.Replicas() {
			if r.Name() == "r0" {
				return !r.Healthy()
			}
		}
		return false
	})
	// r1 does not have the previous response: the engine says so.
	_, rep, status := createResponse(t, k.URL, false, id)
	if rep != "r1" || status != 404 {
		t.Errorf("follow-up of an ejected replica's id: %d from %s, want r1's 404", status, rep)
	}
	if resp, _ := do(t, http.MethodGet, k.URL+"/v1/responses/"+id, ""); resp.StatusCode != 404 || resp.Header.Get("X-Kvroute-Backend") != "r1" {
		t.Errorf("GET of an ejected replica's id: %d from %s", resp.StatusCode, resp.Header.Get("X-Kvroute-Backend"))
	}
	// Back in service, it gets its ids again.
	reps[0].Healthy.Store(true)
	kvtest.WaitFor(t, 5*time.Second, "r0 back", func() bool {
		_, rep, status := createResponse(t, k.URL, false, id)
		return rep == "r0" && status == 200
	})
}

func TestRemovedReplicaForgetsItsResponses(t *testing.T) {
	reps, _ := responsesFleet(t)
	k := kvtest.Start(t, reps)
	on := map[string]int{}
	for i := 0; i < 6; i++ {
		_, rep, _ := createResponse(t, k.URL, i%2 == 0, "")
		on[rep]++
	}
	table := k.Srv.Router.Responses()
	if table.Len() != 6 || on["r0"] == 0 || on["r1"] == 0 {
		t.Fatalf("%d ids recorded (%v), want 6 over both", table.Len(), on)
	}
	cfg := kvtest.Config(reps[1:])
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := k.Srv.Reload(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if table.Len() != on["r1"] {
		t.Errorf("%d ids after r0 left, want r1's %d", table.Len(), on["r1"])
	}
}

func TestResponsesTableBoundFromConfig(t *testing.T) {
	reps, _ := responsesFleet(t)
	k := kvtest.Start(t, reps, func(c *config.Config) { c.Responses.MaxEntries = 2 })
	var ids []string
	for i := 0; i < 5; i++ {
		id, _, _ := createResponse(t, k.URL, i%2 == 0, "")
		ids = append(ids, id)
	}
	table := k.Srv.Router.Responses()
	if table.Len() != 2 || table.Lookup(ids[0]) != nil || table.Lookup(ids[4]) == nil {
		t.Errorf("with max_entries 2: %d ids, oldest kept %v", table.Len(), table.Lookup(ids[0]) != nil)
	}
	// A reload applies new bounds at once.
	cfg := kvtest.Config(reps)
	cfg.Responses.MaxEntries = 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := k.Srv.Reload(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if table.Len() != 1 || table.Lookup(ids[4]) == nil {
		t.Errorf("after reloading max_entries 1: %d ids, newest kept %v", table.Len(), table.Lookup(ids[4]) != nil)
	}
}
