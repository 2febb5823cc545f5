package proxy_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// A usable incoming X-Request-Id is kept, anything else is replaced by a
// generated one; either way the replica gets it, the client gets it back
// (on errors and streams too) and the access log records it.
func TestRequestIDs(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		// A replica that answers with an ID of its own does not override kvroute's.
		w.Header().Set("X-Request-Id", "replica-chosen")
		if strings.Contains(r.URL.Path, "completions") && r.URL.Path != "/v1/chat/completions" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {}\n\ndata: [DONE]\n\n")
			return
		}
		kvtest.Echo(w, r, nil)
	})
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{a}, func(c *config.Config) { c.Auth.APIKeys = []string{"sk-request-id"} })
	addr := strings.TrimPrefix(k.URL, "http://")
	long := strings.Repeat("i", 200)

	cases := []struct {
		name, path, body string
		idHeader         string // raw header line, "" for none
		auth             bool
		status           int
		keep             string // the ID expected to be kept; "" when one must be generated
		reachesReplica   bool
	}{
		{"kept", "/v1/chat/completions", kvtest.ChatBody, "X-Request-Id: client-id-123\r\n", true, 200, "client-id-123", true},
		{"kept with punctuation", "/v1/chat/completions", kvtest.ChatBody, "X-Request-Id: 9f1c2e:trace/42 span=7\r\n", true, 200, "9f1c2e:trace/42 span=7", true},
		{"generated", "/v1/chat/completions", kvtest.ChatBody, "", true, 200, "", true},
		{"too long", "/v1/chat/completions", kvtest.ChatBody, "X-Request-Id: " + long + "\r\n", true, 200, "", true},
		{"not printable", "/v1/chat/completions", kvtest.ChatBody, "X-Request-Id: id-\xc3\xa9\tx\r\n", true, 200, "", true},
		{"on a stream", "/v1/completions", `{"model":"m1","prompt":"hi","stream":true}`, "X-Request-Id: stream-id-1\r\n", true, 200, "stream-id-1", true},
		{"on 401", "/v1/chat/completions", kvtest.ChatBody, "X-Request-Id: denied-id\r\n", false, 401, "denied-id", false},
		{"on 400", "/v1/chat/completions", `{"messages":5}`, "X-Request-Id: bad-body-id\r\n", true, 400, "bad-body-id", false},
		{"on 404 model", "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, "", true, 404, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := a.Hits.Load()
			lines := len(accessLog(logs))
			auth := ""
			if c.auth {
				auth = "Authorization: Bearer sk-request-id\r\n"
			}
			resp, body := rawExchange(t, addr, func(conn net.Conn) {
				_, _ = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s%sContent-Length: %d\r\n\r\n%s",
					c.path, auth, c.idHeader, len(c.body), c.body)
			})
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			got := resp.Header.Values("X-Request-Id")
			if len(got) != 1 {
				t.Fatalf("response X-Request-Id %q, want exactly one", got)
			}
			id := got[0]
			if c.keep != "" && id != c.keep {
				t.Errorf("returned %q, want the client's %q", id, c.keep)
			}
			if c.keep == "" && !hexID.MatchString(id) {
				t.Errorf("returned %q, want a generated 16-hex-digit ID", id)
			}
			if c.reachesReplica {
				if a.Hits.Load() == before {
					t.Fatal("the request did not reach the replica")
				}
				r, _ := a.LastRequest()
				if fwd := r.Header.Values("X-Request-Id"); len(fwd) != 1 || fwd[0] != id {
					t.Errorf("replica got X-Request-Id %q, want [%q]", fwd, id)
				}
			}
			kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool { return len(accessLog(logs)) > lines })
			if logged := accessLog(logs)[lines].ContextMap()["request_id"]; logged != id {
				t.Errorf("logged request_id %v, returned %q", logged, id)
			}
		})
	}

	// Answers fasthttp meets before the handler carry one as well.
	var flood strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&flood, "X-Flood-%d: %s\r\n", i, strings.Repeat("v", 20))
	}
	resp, _ := rawExchange(t, addr, func(conn net.Conn) {
		_, _ = io.WriteString(conn, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"+flood.String()+"\r\n")
	})
	if resp.StatusCode != 431 || !hexID.MatchString(resp.Header.Get("X-Request-Id")) {
		t.Errorf("431: status %d, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}
	// Two requests without an ID get different ones.
	r1, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, map[string]string{"Authorization": "Bearer sk-request-id"})
	r2, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, map[string]string{"Authorization": "Bearer sk-request-id"})
	if id1, id2 := r1.Header.Get("X-Request-Id"), r2.Header.Get("X-Request-Id"); id1 == id2 {
		t.Errorf("two requests got the same generated ID %q", id1)
	}
}
