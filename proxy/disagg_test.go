package proxy_test

import (
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

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// pdReplica is a fake prefill or decode engine: it records the bodies it
// got, decoded, and answers with answer (nil: the default for its role).
type pdReplica struct {
	*kvtest.Replica
	mu     sync.Mutex
	bodies []map[string]any
}

func (r *pdReplica) got() []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string]any(nil), r.bodies...)
}

// newPD starts a fake engine named name whose answers answer writes.
func newPD(t *testing.T, name string, answer func(w http.ResponseWriter, body map[string]any)) *pdReplica {
	r := &pdReplica{}
	r.Replica = kvtest.NewReplica(t, name, func(w http.ResponseWriter, _ *http.Request) {
		_, raw := r.LastRequest()
		var body map[string]any
		if err := json.Unmarshal(raw, &body); err != nil {
			http.Error(w, "bad json", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.bodies = append(r.bodies, body)
		r.mu.Unlock()
		answer(w, body)
	})
	return r
}

// vllmPrefill answers as a vLLM prefill engine with a KV connector: one
// token, the usage, and the transfer parameters naming engine.
func vllmPrefill(engine string) func(http.ResponseWriter, map[string]any) {
	return func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"cmpl-prefill","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}],`+
			`"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":16}},`+
			`"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":%q,"remote_block_ids":[7,8,9],"remote_host":"10.0.0.7","remote_port":5600,"tp_size":1}}`, engine)
	}
}

// decodeAnswer answers as a decode engine: a stream of two events when
// the request asks for one, else a JSON completion.
func decodeAnswer(name string) func(http.ResponseWriter, map[string]any) {
	return func(w http.ResponseWriter, body map[string]any) {
		if body["stream"] == true {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = fmt.Fprintf(w, "data: {\"id\":\"cmpl-%s\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n", name)
			_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"cmpl-%s","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi there"}}],"usage":{"prompt_tokens":40,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":40}}}`, name)
	}
}

// firstFails answers the first request with 500 and the others as a
// decode engine named after the replica asked.
func firstFails() func(http.ResponseWriter, map[string]any) {
	var once sync.Once
	return func(w http.ResponseWriter, body map[string]any) {
		first := false
		once.Do(func() { first = true })
		if first {
			status(500)(w, body)
			return
		}
		decodeAnswer("d")(w, body)
	}
}

// status answers every request with code and a vLLM-style error body.
func status(code int) func(http.ResponseWriter, map[string]any) {
	return func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = fmt.Fprintf(w, `{"object":"error","message":"refused by the engine","code":%d}`, code)
	}
}

// startPD runs kvroute in front of prefill and decode replicas (in that
// order in the configuration) with protocol.
func startPD(t *testing.T, protocol string, prefill, decode []*pdReplica, opts ...kvtest.Option) *kvtest.KV {
	t.Helper()
	return startPDLogged(t, zap.NewNop(), protocol, prefill, decode, opts...)
}

// startPDLogged is startPD with kvroute logging to log.
func startPDLogged(t *testing.T, log *zap.Logger, protocol string, prefill, decode []*pdReplica, opts ...kvtest.Option) *kvtest.KV {
	t.Helper()
	reps := make([]*kvtest.Replica, 0, len(prefill)+len(decode))
	for _, r := range prefill {
		reps = append(reps, r.Replica)
	}
	for _, r := range decode {
		reps = append(reps, r.Replica)
	}
	return kvtest.StartLogged(t, log, reps, append([]kvtest.Option{func(c *config.Config) {
		c.Disaggregation.Protocol = protocol
		for i := range c.Backends {
			c.Backends[i].Role = "decode"
			if i < len(prefill) {
				c.Backends[i].Role = "prefill"
				c.Backends[i].BootstrapPort = 9100 + i
			}
		}
	}}, opts...)...)
}

// A client's own pairing fields, which kvroute must drop.
const hostileFields = `"kv_transfer_params":{"remote_host":"evil"},"bootstrap_room":42,"bootstrap_host":"evil","stream_options":{"include_usage":true}`

func TestVLLMDisaggregated(t *testing.T) {
	for _, stream := range []bool{false, true} {
		for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
			t.Run(fmt.Sprintf("%s stream=%v", path, stream), func(t *testing.T) {
				p0 := newPD(t, "p0", vllmPrefill("engine-p0"))
				d0 := newPD(t, "d0", decodeAnswer("d0"))
				k := startPD(t, "vllm", []*pdReplica{p0}, []*pdReplica{d0})
				prompt := `"messages":[{"role":"user","content":"hello"}]`
				if path == "/v1/completions" {
					prompt = `"prompt":"hello"`
				}
				body := fmt.Sprintf(`{"model":"m1",%s,"max_tokens":50,"stream":%v,%s}`, prompt, stream, hostileFields)
				resp, got := postJSON(t, k.URL+path, body, nil)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "cmpl-d0") || strings.Contains(string(got), "prefill") {
					t.Fatalf("status %d body %s: want the decode replica's answer", resp.StatusCode, got)
				}
				if stream != strings.Contains(resp.Header.Get("Content-Type"), "text/event-stream") {
					t.Errorf("content type %q for stream=%v", resp.Header.Get("Content-Type"), stream)
				}
				if b, r := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route"); b != "d0" || !strings.Contains(r, "round_robin prefill=p0; round_robin") {
					t.Errorf("X-Kvroute-Backend %q, X-Kvroute-Route %q: want d0 and both named", b, r)
				}
				pb, db := p0.got(), d0.got()
				if len(pb) != 1 || len(db) != 1 {
					t.Fatalf("prefill got %d requests, decode %d; want 1 each", len(pb), len(db))
				}
				pre := pb[0]
				params, _ := pre["kv_transfer_params"].(map[string]any)
				if params["do_remote_decode"] != true || params["do_remote_prefill"] != false || params["remote_host"] != nil ||
					pre["max_tokens"] != 1.0 || pre["stream"] != false || pre["stream_options"] != nil || pre["bootstrap_room"] != nil {
					t.Errorf("prefill request %v", pre)
				}
				if _, ok := pre["max_completion_tokens"]; ok != (path == "/v1/chat/completions") {
					t.Errorf("prefill max_completion_tokens present %v on %s", ok, path)
				}
				dec := db[0]
				dparams, _ := dec["kv_transfer_params"].(map[string]any)
				if dparams["remote_engine_id"] != "engine-p0" || dparams["remote_host"] != "10.0.0.7" || dec["max_tokens"] != 50.0 ||
					dec["stream"] != stream || dec["bootstrap_room"] != nil || dec["bootstrap_host"] != nil {
					t.Errorf("decode request %v: want the client's with the prefill answer's kv_transfer_params", dec)
				}
				if stream && dec["stream_options"] == nil {
					t.Errorf("decode request lost the client's stream_options: %v", dec)
				}
			})
		}
	}
}

// Faults of either side: a prefill replica that fails is replaced by
// another; a decode replica that fails by another decode replica with the
// same transfer parameters (no new prefill); a prefill refusal (4xx) is
// the client's answer; a prefill replica without a KV connector fails the
// request with a clear error.
func TestVLLMDisaggregatedFaults(t *testing.T) {
	cases := []struct {
		name            string
		prefill, decode []func(http.ResponseWriter, map[string]any)
		status          int
		want            string // in the answer body
		prefills        []int  // requests each prefill replica got
		decodes         []int
	}{
		{name: "prefill 500, next prefill", prefill: []func(http.ResponseWriter, map[string]any){status(500), vllmPrefill("engine-p1")},
			decode: []func(http.ResponseWriter, map[string]any){decodeAnswer("d0")}, status: 200, want: "cmpl-d0", prefills: []int{1, 1}, decodes: []int{1}},
		{name: "decode 500, next decode", prefill: []func(http.ResponseWriter, map[string]any){vllmPrefill("engine-p0")},
			decode: []func(http.ResponseWriter, map[string]any){firstFails(), nil}, status: 200, want: "cmpl-d", prefills: []int{1}, decodes: []int{1, 1}},
		{name: "prefill refuses", prefill: []func(http.ResponseWriter, map[string]any){status(400)},
			decode: []func(http.ResponseWriter, map[string]any){decodeAnswer("d0")}, status: 400, want: "refused by the engine", prefills: []int{1}, decodes: []int{0}},
		{name: "no connector", prefill: []func(http.ResponseWriter, map[string]any){decodeAnswer("p0")},
			decode: []func(http.ResponseWriter, map[string]any){decodeAnswer("d0")}, status: 502, want: "prefill_without_transfer", prefills: []int{1}, decodes: []int{0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var ps, ds []*pdReplica
			for i, h := range tc.prefill {
				ps = append(ps, newPD(t, fmt.Sprintf("p%d", i), h))
			}
			for i, h := range tc.decode {
				if h == nil { // shares the one before: the first decode request fails, wherever it goes
					h = tc.decode[i-1]
				}
				ds = append(ds, newPD(t, fmt.Sprintf("d%d", i), h))
			}
			// Round-robin over the prefill side: the first request meets p0 first.
			k := startPD(t, "vllm", ps, ds)
			resp, got := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
			if resp.StatusCode != tc.status || !strings.Contains(string(got), tc.want) {
				t.Fatalf("status %d body %s; want %d with %q", resp.StatusCode, got, tc.status, tc.want)
			}
			for i, r := range ps {
				if n := len(r.got()); n != tc.prefills[i] {
					t.Errorf("prefill p%d got %d requests, want %d", i, n, tc.prefills[i])
				}
			}
			for i, r := range ds {
				if n := len(r.got()); n != tc.decodes[i] {
					t.Errorf("decode d%d got %d requests, want %d", i, n, tc.decodes[i])
				}
			}
			if len(ds) == 2 {
				a, b := ds[0].got(), ds[1].got()
				pa, _ := a[0]["kv_transfer_params"].(map[string]any)
				pb, _ := b[0]["kv_transfer_params"].(map[string]any)
				if pa["remote_engine_id"] != "engine-p0" || pb["remote_engine_id"] != "engine-p0" {
					t.Errorf("decode retry parameters %v then %v: want the one prefill's both times", pa, pb)
				}
			}
		})
	}
}

// SGLang: both sides get the request at once with the prefill replica's
// bootstrap server and a room kvroute mints; a decode failure is retried
// on another decode replica with a new prefill in a new room.
func TestSGLangDisaggregated(t *testing.T) {
	p0 := newPD(t, "p0", decodeAnswer("p0"))
	h := firstFails()
	d0, d1 := newPD(t, "d0", h), newPD(t, "d1", h)
	k := startPD(t, "sglang", []*pdReplica{p0}, []*pdReplica{d0, d1})
	body := `{"model":"m1","messages":[{"role":"user","content":"hello"}],"stream":true,` + hostileFields + `}`
	resp, got := postJSON(t, k.URL+"/v1/chat/completions", body, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "cmpl-d") {
		t.Fatalf("status %d body %s", resp.StatusCode, got)
	}
	kvtest.WaitFor(t, 5*time.Second, "both prefill requests", func() bool { return len(p0.got()) == 2 })
	pb, db := p0.got(), append(d0.got(), d1.got()...)
	if len(d0.got()) != 1 || len(d1.got()) != 1 {
		t.Fatalf("decode replicas got %d and %d requests, want 1 each (one failed, one retried)", len(d0.got()), len(d1.got()))
	}
	rooms := map[any]bool{}
	for i := range 2 {
		for _, b := range []map[string]any{pb[i], db[i]} {
			if b["bootstrap_host"] != "127.0.0.1" || b["bootstrap_port"] != 9100.0 || b["kv_transfer_params"] != nil || b["stream"] != true {
				t.Errorf("request %v: want bootstrap 127.0.0.1:9100, no client fields", b)
			}
		}
		room := db[i]["bootstrap_room"]
		if room == nil || room == 42.0 {
			t.Errorf("decode room %v: want one kvroute minted", room)
		}
		rooms[room] = true
	}
	if len(rooms) != 2 {
		t.Errorf("rooms %v: a retry must pair in a new room", rooms)
	}
	// Each prefill request carried one of the rooms its decode got.
	for _, b := range pb {
		if !rooms[b["bootstrap_room"]] {
			t.Errorf("prefill room %v is not a decode's %v", b["bootstrap_room"], rooms)
		}
	}
}

// A client that goes away mid-stream ends the decode replica's request
// at its next event, in either protocol.
func TestDisaggregatedClientGoneCancelsDecode(t *testing.T) {
	for _, protocol := range []string{"vllm", "sglang"} {
		t.Run(protocol, func(t *testing.T) {
			canceled := make(chan struct{})
			prefill := vllmPrefill("engine-p0")
			if protocol == "sglang" {
				prefill = decodeAnswer("p0")
			}
			p0 := newPD(t, "p0", prefill)
			d0 := kvtest.NewReplica(t, "d0", func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for range 200 { // an event every 50 ms, as a decode engine streams
					_, _ = fmt.Fprint(w, "data: {\"id\":\"cmpl-d0\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n")
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						close(canceled)
						return
					case <-time.After(50 * time.Millisecond):
					}
				}
			})
			k := startPD(t, protocol, []*pdReplica{p0}, []*pdReplica{{Replica: d0}})
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions",
				strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hello"}],"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 16)
			if _, err := io.ReadFull(resp.Body, buf); err != nil || !strings.HasPrefix(string(buf), "data: ") {
				t.Fatalf("first event: %q %v", buf, err)
			}
			_ = resp.Body.Close() // the client goes away
			select {
			case <-canceled:
			case <-time.After(5 * time.Second):
				t.Fatal("the decode replica's request was not ended when the client went away")
			}
		})
	}
}

// A client that goes away while its prompt is prefilled calls the
// prefill off: its connection is closed (the engine sees its request
// end), no other replica is tried, with vLLM no decode is sent, and the
// request is logged as 499.
func TestDisaggregatedClientGoneCancelsPrefill(t *testing.T) {
	for _, protocol := range []string{"vllm", "sglang"} {
		t.Run(protocol, func(t *testing.T) {
			arrived, ended := make(chan struct{}), make(chan struct{})
			var arrivals atomic.Int32
			p0 := &pdReplica{Replica: kvtest.NewReplica(t, "p0", func(w http.ResponseWriter, r *http.Request) {
				if arrivals.Add(1) > 1 {
					status(http.StatusTeapot)(w, nil)
					return
				}
				close(arrived)
				select { // a long prefill
				case <-r.Context().Done():
					close(ended)
				case <-time.After(10 * time.Second):
					status(http.StatusGatewayTimeout)(w, nil)
				}
			})}
			// SGLang's decode fails once its room's prefill is gone.
			d0 := newPD(t, "d0", func(w http.ResponseWriter, body map[string]any) {
				select {
				case <-ended:
					status(http.StatusInternalServerError)(w, body)
				case <-time.After(10 * time.Second):
					decodeAnswer("d0")(w, body)
				}
			})
			p1, d1 := newPD(t, "p1", vllmPrefill("engine-p1")), newPD(t, "d1", decodeAnswer("d1"))
			core, logs := observer.New(zapcore.InfoLevel)
			k := startPDLogged(t, zap.New(core), protocol, []*pdReplica{p0, p1}, []*pdReplica{d0, d1},
				func(c *config.Config) { c.Backends[0].Weight = 100 }) // p0 first
			clientLeaves(t, k, logs, arrived, ended, "prefill")
			if n := len(p1.got()) + len(d1.got()); n != 0 {
				t.Errorf("%d requests went to p1 and d1 after the client left", n)
			}
			if protocol == "vllm" && len(d0.got()) != 0 {
				t.Errorf("a decode request was sent for a client that left")
			}
			if n := arrivals.Load(); n != 1 {
				t.Errorf("p0 got %d prefill requests, want 1", n)
			}
		})
	}
}

// A client that leaves while its decode replica works on an answer it did
// not ask to stream calls the decode off too: its connection to the
// replica is closed, no other replica is tried, the access line says 499.
func TestDisaggregatedClientGoneCancelsBufferedDecode(t *testing.T) {
	for _, protocol := range []string{"vllm", "sglang"} {
		t.Run(protocol, func(t *testing.T) {
			arrived, ended := make(chan struct{}), make(chan struct{})
			var arrivals atomic.Int32
			d0 := &pdReplica{Replica: kvtest.NewReplica(t, "d0", func(w http.ResponseWriter, r *http.Request) {
				if arrivals.Add(1) > 1 {
					status(http.StatusTeapot)(w, nil)
					return
				}
				close(arrived)
				select { // a long decode
				case <-r.Context().Done():
					close(ended)
				case <-time.After(10 * time.Second):
					decodeAnswer("d0")(w, map[string]any{})
				}
			})}
			p0, d1 := newPD(t, "p0", vllmPrefill("engine-p0")), newPD(t, "d1", decodeAnswer("d1"))
			core, logs := observer.New(zapcore.InfoLevel)
			k := startPDLogged(t, zap.New(core), protocol, []*pdReplica{p0}, []*pdReplica{d0, d1},
				func(c *config.Config) { c.Backends[1].Weight = 100 }) // d0 first
			clientLeaves(t, k, logs, arrived, ended, "decode")
			if n := len(d1.got()); n != 0 {
				t.Errorf("%d requests went to d1 after the client left", n)
			}
			if n := arrivals.Load(); n != 1 {
				t.Errorf("d0 got %d decode requests, want 1", n)
			}
		})
	}
}

// A non-streamed disaggregated answer larger than
// limits.max_buffered_response_bytes fails with an error naming the limit,
// and is not retried elsewhere nor held against the replica.
func TestDisaggregatedAnswerTooLarge(t *testing.T) {
	big := func(w http.ResponseWriter, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":%q}}]}`, strings.Repeat("a", 8192))
	}
	p0, d0, d1 := newPD(t, "p0", vllmPrefill("engine-p0")), newPD(t, "d0", big), newPD(t, "d1", big)
	k := startPD(t, "vllm", []*pdReplica{p0}, []*pdReplica{d0, d1},
		func(c *config.Config) { c.Limits.MaxBufferedResponseBytes = 4096 })
	resp, body := kvtest.Post(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil) //nolint:bodyclose // Post reads and closes the body
	if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "max_buffered_response_bytes") {
		t.Fatalf("status %d, body of %d bytes %.200s; want 502 naming the limit", resp.StatusCode, len(body), body)
	}
	if n := len(d0.got()) + len(d1.got()); n != 1 {
		t.Errorf("%d decode requests, want 1 (no retry)", n)
	}
}

// SGLang: a prefill replica that fails makes its decode fail as SGLang's
// does (the KV never comes); the retry pairs another decode replica with
// another prefill replica, in a new room.
func TestSGLangPrefillFailure(t *testing.T) {
	var mu sync.Mutex
	outcome := map[any]chan int{} // room → the prefill's status
	roomOf := func(body map[string]any) chan int {
		mu.Lock()
		defer mu.Unlock()
		r := body["bootstrap_room"]
		if outcome[r] == nil {
			outcome[r] = make(chan int, 1)
		}
		return outcome[r]
	}
	prefill := func(code int) func(http.ResponseWriter, map[string]any) {
		return func(w http.ResponseWriter, body map[string]any) {
			roomOf(body) <- code
			if code != http.StatusOK {
				status(code)(w, body)
				return
			}
			decodeAnswer("prefill")(w, body)
		}
	}
	decode := func(w http.ResponseWriter, body map[string]any) {
		select {
		case code := <-roomOf(body):
			if code != http.StatusOK {
				status(http.StatusInternalServerError)(w, body) // the KV transfer failed
				return
			}
			decodeAnswer("d")(w, body)
		case <-time.After(5 * time.Second):
			status(http.StatusGatewayTimeout)(w, body)
		}
	}
	p0, p1 := newPD(t, "p0", prefill(http.StatusInternalServerError)), newPD(t, "p1", prefill(http.StatusOK))
	d0, d1 := newPD(t, "d0", decode), newPD(t, "d1", decode)
	// Weights 3:1 make round-robin pick p0 twice in a row: only the
	// failure it reported keeps the retry off it.
	k := startPD(t, "sglang", []*pdReplica{p0, p1}, []*pdReplica{d0, d1}, func(c *config.Config) { c.Backends[0].Weight = 3 })
	resp, got := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "cmpl-d") {
		t.Fatalf("status %d body %s", resp.StatusCode, got)
	}
	if len(p0.got()) != 1 || len(p1.got()) != 1 || len(d0.got()) != 1 || len(d1.got()) != 1 {
		t.Errorf("requests: p0 %d, p1 %d, d0 %d, d1 %d; want one each (a failed pair, then the other)",
			len(p0.got()), len(p1.got()), len(d0.got()), len(d1.got()))
	}
	if r := resp.Header.Get("X-Kvroute-Route"); !strings.Contains(r, "prefill=p1;") {
		t.Errorf("X-Kvroute-Route %q: want the answer's prefill, p1", r)
	}
}

// The access line of a disaggregated request names both replicas; a
// request that is not split (another path) has no prefill_replica.
func TestDisaggregatedAccessLine(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	p0 := newPD(t, "p0", vllmPrefill("engine-p0"))
	d0 := newPD(t, "d0", decodeAnswer("d0"))
	k := startPDLogged(t, zap.New(core), "vllm", []*pdReplica{p0}, []*pdReplica{d0})
	if resp, got := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if resp, err := httpGet(t, k.URL+"/v1/models"); err == nil {
		_ = resp.Body.Close()
	}
	kvtest.WaitFor(t, 5*time.Second, "two access lines", func() bool { return logs.FilterMessage("request").Len() >= 2 })
	for _, e := range logs.FilterMessage("request").All() {
		f := e.ContextMap()
		prefill, has := f["prefill_replica"]
		switch f["path"] {
		case "/v1/chat/completions":
			if prefill != "p0" || f["replica"] != "d0" {
				t.Errorf("split request's line: replica %v, prefill_replica %v; want d0 and p0", f["replica"], prefill)
			}
		default:
			if has {
				t.Errorf("line of %v carries prefill_replica %v", f["path"], prefill)
			}
		}
	}
}

// With vLLM's protocol the decode replica is chosen once the prefill has
// answered, by its load then: while the prefill runs no decode replica
// counts the request, and one that became busy meanwhile is passed over.
func TestVLLMDecodeReplicaChosenAfterThePrefill(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	p0 := newPD(t, "p0", func(w http.ResponseWriter, body map[string]any) {
		arrived <- struct{}{}
		<-release
		vllmPrefill("engine-p0")(w, body)
	})
	d0, d1 := newPD(t, "d0", decodeAnswer("d0")), newPD(t, "d1", decodeAnswer("d1"))
	d0.Waiting.Store(8) // d1 is the less loaded when the request arrives
	k := startPD(t, "vllm", []*pdReplica{p0}, []*pdReplica{d0, d1}, func(c *config.Config) { c.Policy = "least_load" })
	waiting := func(name string, want float64) func() bool {
		return func() bool {
			s, fresh := k.Srv.Fleet.ByName(name).SnapshotAt(time.Now())
			return fresh && s != nil && s.Waiting == want
		}
	}
	kvtest.WaitFor(t, 5*time.Second, "d0's queue in its metrics", waiting("d0", 8))
	first := asyncPost(t.Context(), k.URL, nil)
	<-arrived
	if a, b := k.Srv.Fleet.ByName("d0").InFlight(), k.Srv.Fleet.ByName("d1").InFlight(); a+b != 0 {
		t.Fatalf("decode replicas' in-flight %d and %d while the prefill runs, want none", a, b)
	}
	d0.Waiting.Store(0)
	d1.Waiting.Store(8) // now d0 is
	kvtest.WaitFor(t, 5*time.Second, "the queues swapped in the metrics", func() bool { return waiting("d0", 0)() && waiting("d1", 8)() })
	close(release)
	a := await(t, first)
	if a.status != http.StatusOK || !strings.Contains(a.body, "cmpl-d0") {
		t.Fatalf("status %d body %s: want d0's answer, the less loaded once the prefill answered", a.status, a.body)
	}
	if n := len(d1.got()); n != 0 {
		t.Errorf("d1 got %d requests, want none", n)
	}
}

func clientLeaves(t *testing.T, k *kvtest.KV, logs *observer.ObservedLogs, arrived, ended <-chan struct{}, side string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, k.URL+"/v1/chat/completions", strings.NewReader(kvtest.ChatBody))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	done := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatalf("the %s request did not arrive", side)
	}
	cancel() // the client goes away
	if err := <-done; err == nil {
		t.Error("the client's request ended without an error")
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatalf("the %s request was not called off when the client went away", side)
	}
	kvtest.WaitFor(t, 5*time.Second, "the access line", func() bool { return logs.FilterMessage("request").Len() >= 1 })
	if f := logs.FilterMessage("request").All()[0].ContextMap(); f["status"] != int64(499) {
		t.Errorf("access line status %v, want 499", f["status"])
	}
}

// startLocalPrefill runs kvroute (cache_aware, vLLM's protocol) in front
// of prefill replica p0 and decode replicas d0 and d1, with
// disaggregation.local_prefill_tokens 256.
func startLocalPrefill(t *testing.T, p0, d0, d1 *pdReplica) *kvtest.KV {
	t.Helper()
	return startPD(t, "vllm", []*pdReplica{p0}, []*pdReplica{d0, d1}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Disaggregation.LocalPrefillTokens = 256
	})
}

// With disaggregation.local_prefill_tokens, a conversation's next turn
// goes whole to the decode replica that decoded the last one (it received
// that prompt's KV): no prefill request, the client's pairing fields
// dropped, the rest of the client's request as sent.
func TestVLLMLocalPrefill(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			p0 := newPD(t, "p0", vllmPrefill("engine-p0"))
			d0 := newPD(t, "d0", decodeAnswer("d0"))
			d1 := newPD(t, "d1", decodeAnswer("d1"))
			k := startLocalPrefill(t, p0, d0, d1)
			system := strings.Repeat("Answer as a ship's pilot would, in few words. ", 30)
			turn1 := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":"where is the harbour?"}`, system)
			resp, got := postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[`+turn1+`],"max_tokens":50}`, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("first turn: status %d: %s", resp.StatusCode, got)
			}
			decoded := resp.Header.Get("X-Kvroute-Backend")
			holder := map[string]*pdReplica{"d0": d0, "d1": d1}[decoded]
			if holder == nil || len(p0.got()) != 1 {
				t.Fatalf("first turn decoded on %q with %d prefills: want a decode replica after one", decoded, len(p0.got()))
			}
			turn2 := turn1 + `,{"role":"assistant","content":"hi there"},{"role":"user","content":"and the lighthouse?"}`
			body := fmt.Sprintf(`{"model":"m1","messages":[%s],"max_tokens":50,"stream":%v,%s}`, turn2, stream, hostileFields)
			resp, got = postJSON(t, k.URL+"/v1/chat/completions", body, nil)
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(got), "cmpl-"+decoded) {
				t.Fatalf("second turn: status %d body %s: want %s's answer", resp.StatusCode, got, decoded)
			}
			if b, r := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route"); b != decoded || !strings.HasPrefix(r, "decode_local matched=") || strings.Contains(r, "prefill=") {
				t.Errorf("X-Kvroute-Backend %q, X-Kvroute-Route %q: want %s computing the prompt itself", b, r, decoded)
			}
			if n := len(p0.got()); n != 1 {
				t.Errorf("the prefill replica got %d requests, want only the first turn's", n)
			}
			bodies := holder.got()
			dec := bodies[len(bodies)-1]
			if dec["kv_transfer_params"] != nil || dec["bootstrap_room"] != nil || dec["bootstrap_host"] != nil ||
				dec["max_tokens"] != 50.0 || dec["stream"] != stream || (stream && dec["stream_options"] == nil) {
				t.Errorf("local request %v: want the client's without its pairing fields", dec)
			}
			if msgs, _ := dec["messages"].([]any); len(msgs) != 4 {
				t.Errorf("local request carries %d messages, want the client's 4", len(msgs))
			}
		})
	}
}

// A local prefill that fails before any byte is retried as an ordinary
// pair: the other decode replica holds nothing of the prompt, so the
// prefill replica computes it and its KV goes over.
func TestVLLMLocalPrefillRetriedAsAPair(t *testing.T) {
	// Both decode replicas fail a request without kv_transfer_params.
	pairedOnly := func(name string) func(http.ResponseWriter, map[string]any) {
		return func(w http.ResponseWriter, body map[string]any) {
			if body["kv_transfer_params"] == nil {
				status(500)(w, body)
				return
			}
			decodeAnswer(name)(w, body)
		}
	}
	p0 := newPD(t, "p0", vllmPrefill("engine-p0"))
	d0 := newPD(t, "d0", pairedOnly("d0"))
	d1 := newPD(t, "d1", pairedOnly("d1"))
	k := startLocalPrefill(t, p0, d0, d1)
	turn1 := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":"where is the harbour?"}`, strings.Repeat("Answer in few words. ", 60))
	resp, got := postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[`+turn1+`],"max_tokens":50}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first turn: status %d: %s", resp.StatusCode, got)
	}
	first := resp.Header.Get("X-Kvroute-Backend")
	turn2 := turn1 + `,{"role":"assistant","content":"hi there"},{"role":"user","content":"and the lighthouse?"}`
	resp, got = postJSON(t, k.URL+"/v1/chat/completions", `{"model":"m1","messages":[`+turn2+`],"max_tokens":50}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("second turn: status %d: %s", resp.StatusCode, got)
	}
	second, route := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route")
	if second == first || !strings.Contains(route, "prefill=p0") {
		t.Errorf("second turn answered by %s (%s) after %s failed it: want the other, paired with p0", second, route, first)
	}
	failedLocal := map[string]*pdReplica{"d0": d0, "d1": d1}[first].got()
	if n := len(p0.got()); n != 2 || len(failedLocal) != 2 || failedLocal[1]["kv_transfer_params"] != nil {
		t.Errorf("prefills %d, requests to %s %d (the last %v): want 2, and 2 with the local attempt last", n, first, len(failedLocal), failedLocal[len(failedLocal)-1]["kv_transfer_params"])
	}
}

// With disaggregation.local_prefill_backlog, a request arriving while the
// only prefill replica is that far behind (a prompt waiting for its
// prefill there) goes whole to a decode replica computing nothing else,
// as it was sent but for its pairing fields; the waiting prompt is paired
// as usual once its prefill ends.
func TestVLLMBacklogRelief(t *testing.T) {
	gate, arrived := make(chan struct{}), make(chan struct{}, 1)
	prefill := vllmPrefill("engine-p0")
	p0 := newPD(t, "p0", func(w http.ResponseWriter, body map[string]any) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		<-gate
		prefill(w, body)
	})
	d0 := newPD(t, "d0", decodeAnswer("d0"))
	d1 := newPD(t, "d1", decodeAnswer("d1"))
	k := startPD(t, "vllm", []*pdReplica{p0}, []*pdReplica{d0, d1}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Disaggregation.LocalPrefillBacklog = 16
	})
	ask := func(topic string) string {
		return fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":%q}],"max_tokens":20,%s}`, strings.Repeat("Tell me of "+topic+". ", 40), hostileFields)
	}
	type answer struct {
		resp *http.Response
		body []byte
	}
	// post sends a request about topic and hands over its answer.
	post := func(topic string) <-chan answer {
		ch := make(chan answer, 1)
		go func() {
			resp, got := postJSON(t, k.URL+"/v1/chat/completions", ask(topic), nil)
			ch <- answer{resp, got}
		}()
		return ch
	}
	first := post("harbours")
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the first prompt never reached the prefill replica")
	}
	second := post("lighthouses")
	var b answer
	select {
	case b = <-second:
		close(gate)
	case <-time.After(5 * time.Second):
		close(gate) // it waits behind the first prompt: no relief
		b = <-second
	}
	resp, got := b.resp, b.body
	backend, route := resp.Header.Get("X-Kvroute-Backend"), resp.Header.Get("X-Kvroute-Route")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(route, "decode_backlog matched=") || strings.Contains(route, "prefill=") {
		t.Fatalf("second request: status %d, route %q, body %s: want a decode replica computing it itself", resp.StatusCode, route, got)
	}
	relief := map[string]*pdReplica{"d0": d0, "d1": d1}[backend]
	if relief == nil || !strings.Contains(string(got), "cmpl-"+backend) {
		t.Fatalf("second request answered by %q: %s", backend, got)
	}
	bodies := relief.got()
	if dec := bodies[len(bodies)-1]; dec["kv_transfer_params"] != nil || dec["bootstrap_room"] != nil || dec["max_tokens"] != 20.0 {
		t.Errorf("relief request %v: want the client's without its pairing fields", dec)
	}
	a := <-first
	if a.resp.StatusCode != http.StatusOK || !strings.Contains(a.resp.Header.Get("X-Kvroute-Route"), "prefill=p0") {
		t.Errorf("first request: status %d, route %q: want paired with p0", a.resp.StatusCode, a.resp.Header.Get("X-Kvroute-Route"))
	}
	if n := len(p0.got()); n != 1 {
		t.Errorf("the prefill replica got %d requests, want the first one's only", n)
	}
}
