package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// accessLog returns the access-log entries captured so far.
func accessLog(logs *observer.ObservedLogs) []observer.LoggedEntry {
	var out []observer.LoggedEntry
	for _, e := range logs.All() {
		if e.LoggerName == "access" {
			out = append(out, e)
		}
	}
	return out
}

// requestCounts scrapes kvroute_requests_total from the admin /metrics,
// summed by status code.
func requestCounts(t *testing.T, admin string) map[string]float64 {
	t.Helper()
	return requestCountsBy(t, admin, "status")
}

// requestCountsBy scrapes kvroute_requests_total summed by label.
func requestCountsBy(t *testing.T, admin, label string) map[string]float64 {
	t.Helper()
	return counterBy(t, admin, "kvroute_requests_total", label)
}

// counterBy scrapes the counter name summed by label.
func counterBy(t *testing.T, admin, name, label string) map[string]float64 {
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
	if f := fams[name]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func total(counts map[string]float64) float64 {
	n := 0.0
	for _, v := range counts {
		n += v
	}
	return n
}

var hexID = regexp.MustCompile(`^[0-9a-f]{16}$`)

// Every answer, the ones kvroute writes itself before routing included,
// gives exactly one access-log line with all its fields and one
// kvroute_requests_total sample.
func TestSelfWrittenAnswersAreAccounted(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	hold := make(chan struct{})
	var holdOnce sync.Once
	releaseHold := func() { holdOnce.Do(func() { close(hold) }) }
	t.Cleanup(releaseHold)
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Header.Get("X-Hold") != "":
			<-hold
		case r.Header.Get("X-Slow") != "":
			time.Sleep(400 * time.Millisecond)
		}
		kvtest.Echo(w, r, nil)
	})
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{a}, func(c *config.Config) {
		c.Auth.APIKeys = []string{"sk-acct-key"}
		c.Limits.MaxInflight = 1
		c.Timeouts.ClientHeader = 500 * time.Millisecond
	})
	addr := strings.TrimPrefix(k.URL, "http://")
	const ua, xff = "acct-test/1.0", "10.9.8.7"
	postBody := func(id, body string, extra ...string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nUser-Agent: " + ua +
			"\r\nX-Forwarded-For: " + xff + "\r\nX-Request-Id: " + id + "\r\n" + strings.Join(extra, "") +
			fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
	}
	post := func(id string, extra ...string) string { return postBody(id, kvtest.ChatBody, extra...) }
	authed := "Authorization: Bearer sk-acct-key\r\n"
	send := func(s string) func(net.Conn) { return func(c net.Conn) { _, _ = io.WriteString(c, s) } }
	var flood strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&flood, "X-Flood-%d: %s\r\n", i, strings.Repeat("v", 20))
	}
	tooLarge := func(id string, expect bool) string {
		h := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nUser-Agent: " + ua + "\r\nX-Request-Id: " + id + "\r\n" + authed +
			"Content-Type: application/json\r\nContent-Length: 2097152\r\n"
		if expect {
			h += "Expect: 100-continue\r\n"
		}
		return h + "\r\n"
	}

	cases := []struct {
		name   string
		status int
		id     string // the X-Request-Id sent; "" when the request is too broken to carry one
		path   string // the path logged, when the request line was read
		write  func(net.Conn)
		before func() // runs first (and its own requests are not counted here)
		gone   bool   // the client leaves without reading an answer
		xff    bool   // the request carries X-Forwarded-For
	}{
		{name: "ok", status: 200, id: "acct-ok", path: "/v1/chat/completions", write: send(post("acct-ok", authed)), xff: true},
		{name: "malformed HTTP", status: 400, write: send("\x00\x01\x02 nonsense\r\n\r\n")},
		{name: "bad JSON", status: 400, id: "acct-400", path: "/v1/chat/completions", write: send(postBody("acct-400", `{"messages":[`, authed)), xff: true},
		{name: "no API key", status: 401, id: "acct-401", path: "/v1/chat/completions", write: send(post("acct-401")), xff: true},
		{name: "slow headers", status: 408, write: func(c net.Conn) {
			_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
			time.Sleep(1500 * time.Millisecond)
		}},
		{name: "body over the limit with Expect: 100-continue", status: 413, id: "acct-413-expect", path: "/v1/chat/completions", write: send(tooLarge("acct-413-expect", true))},
		{name: "body over the limit", status: 413, id: "acct-413", path: "/v1/chat/completions", write: send(tooLarge("acct-413", false))},
		{name: "long URL", status: 414, id: "acct-414", path: "/v1/models", write: send("GET /v1/models?" + strings.Repeat("q", 10000) + " HTTP/1.1\r\nHost: x\r\nUser-Agent: " + ua + "\r\nX-Request-Id: acct-414\r\n\r\n")},
		{name: "header flood", status: 431, write: send("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + flood.String() + "\r\n")},
		{name: "client gone", status: 499, id: "acct-499", path: "/v1/chat/completions", write: send(post("acct-499", authed, "X-Slow: 1\r\n")), gone: true, xff: true},
		// fasthttp drops the request's headers when its body fails: the
		// line has a generated ID and no method or path.
		{name: "client gone mid-body", status: 499, write: send(strings.TrimSuffix(post("acct-499-body", authed), `"hello"}]}`)), gone: true},
		{name: "over max_inflight", status: 503, id: "acct-503", path: "/v1/chat/completions", write: send(post("acct-503", authed)), xff: true, before: func() {
			go func() {
				postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, map[string]string{"Authorization": "Bearer sk-acct-key", "X-Hold": "1"})
			}()
			kvtest.WaitFor(t, 5*time.Second, "a request held at the replica", func() bool { return a.Hits.Load() > 0 && k.Srv.Fleet.Replicas()[0].InFlight() == 1 })
		}},
	}
	startLines, startCounts := len(accessLog(logs)), requestCounts(t, k.Admin)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.before != nil {
				c.before()
			}
			lines, counts := len(accessLog(logs)), requestCounts(t, k.Admin)
			var respID string
			if c.gone {
				conn := dialTCP(t, addr)
				c.write(conn)
				time.Sleep(50 * time.Millisecond) // let the request arrive whole before the close
				_ = conn.Close()
			} else {
				resp, body := rawExchange(t, addr, c.write)
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d: %.200s", resp.StatusCode, c.status, body)
				}
				if c.status != 200 {
					assertOpenAIError(t, body, "")
				}
				respID = resp.Header.Get("X-Request-Id")
			}
			var mine []observer.LoggedEntry
			kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool {
				mine = nil
				for _, e := range accessLog(logs)[lines:] {
					if c.id == "" || e.ContextMap()["request_id"] == c.id {
						mine = append(mine, e)
					}
				}
				return len(mine) > 0
			})
			if c.before != nil {
				releaseHold()
			}
			if len(mine) != 1 {
				t.Fatalf("%d access-log lines, want 1: %v", len(mine), mine)
			}
			e := mine[0]
			f := e.ContextMap()
			if e.Time.IsZero() || e.Message != "request" {
				t.Errorf("entry %q at %v", e.Message, e.Time)
			}
			if got := f["status"]; got != int64(c.status) {
				t.Errorf("status field %v, want %d", got, c.status)
			}
			id, _ := f["request_id"].(string)
			switch {
			case c.id != "" && id != c.id:
				t.Errorf("request_id %q, want the client's %q", id, c.id)
			case c.id == "" && !hexID.MatchString(id):
				t.Errorf("generated request_id %q, want 16 hex digits", id)
			}
			if !c.gone && respID != id {
				t.Errorf("response X-Request-Id %q, logged %q", respID, id)
			}
			if client, _ := f["client"].(string); !strings.HasPrefix(client, "127.0.0.1:") {
				t.Errorf("client %q", client)
			}
			if c.path != "" {
				if f["path"] != c.path {
					t.Errorf("path %v, want %s", f["path"], c.path)
				}
				if f["user_agent"] != ua {
					t.Errorf("user_agent %v", f["user_agent"])
				}
				if want := map[bool]string{true: "POST", false: "GET"}[strings.HasPrefix(c.path, "/v1/chat")]; f["method"] != want {
					t.Errorf("method %v, want %s", f["method"], want)
				}
			}
			if c.xff && f["x_forwarded_for"] != xff {
				t.Errorf("x_forwarded_for %v", f["x_forwarded_for"])
			}
			bytes, _ := f["bytes"].(int64)
			if c.gone && bytes != 0 || !c.gone && bytes <= 0 {
				t.Errorf("bytes %d", bytes)
			}
			dur, _ := f["duration"].(time.Duration)
			ttfb, _ := f["ttfb"].(time.Duration)
			if dur <= 0 || ttfb < 0 || ttfb > dur || !c.gone && ttfb == 0 {
				t.Errorf("duration %v ttfb %v", dur, ttfb)
			}
			for _, k := range []string{"model", "replica", "route", "x_forwarded_for", "attempts", "error"} {
				if _, ok := f[k]; !ok {
					t.Errorf("field %s missing", k)
				}
			}
			if c.status == 200 || c.id == "acct-499" {
				if f["replica"] != "a" || f["model"] != "m1" {
					t.Errorf("replica %v model %v", f["replica"], f["model"])
				}
			}
			after := requestCounts(t, k.Admin)
			if d := after[fmt.Sprint(c.status)] - counts[fmt.Sprint(c.status)]; d != 1 {
				t.Errorf("kvroute_requests_total{status=%q} moved by %v, want 1", fmt.Sprint(c.status), d)
			}
		})
	}
	kvtest.WaitFor(t, 5*time.Second, "every request settled", func() bool { return k.Srv.Fleet.Replicas()[0].InFlight() == 0 })
	if lines, samples := len(accessLog(logs))-startLines, total(requestCounts(t, k.Admin))-total(startCounts); float64(lines) != samples {
		t.Errorf("%d access-log lines but %v kvroute_requests_total samples", lines, samples)
	}
	for _, e := range accessLog(logs) {
		if id, _ := e.ContextMap()["request_id"].(string); e.ContextMap()["status"] == int64(499) && id != "acct-499" && !hexID.MatchString(id) {
			t.Errorf("unexpected 499: %v", e.ContextMap())
		}
	}
}
