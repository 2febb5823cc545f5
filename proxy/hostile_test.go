package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// rawExchange writes raw bytes to kvroute and reads one HTTP response,
// whose body it reads and closes.
//
//bodyclose:handled
func rawExchange(t *testing.T, addr string, write func(net.Conn)) (*http.Response, []byte) {
	t.Helper()
	conn := dialTCP(t, addr)
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	write(conn)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no HTTP response: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

func TestHostileInput(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) {
		c.Policy = "cache_aware"
		c.Limits.MaxBodyBytes = 8 << 20
		c.Timeouts.ClientHeader = 500 * time.Millisecond
	})
	addr := strings.TrimPrefix(k.URL, "http://")
	send := func(s string) func(net.Conn) { return func(c net.Conn) { _, _ = io.WriteString(c, s) } }
	req := func(path, body string, extra ...string) string {
		return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
			path, strings.Join(extra, ""), len(body), body)
	}
	millionMessages := `{"messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, 1_000_000) + `{"role":"user","content":"x"}]}`
	var flood strings.Builder
	for i := 0; i < 3000; i++ {
		fmt.Fprintf(&flood, "X-Flood-%d: %s\r\n", i, strings.Repeat("v", 20))
	}
	cases := []struct {
		name   string
		write  func(net.Conn)
		status int
		json   bool // an OpenAI-style body is expected
	}{
		{"malformed json", send(req("/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}`)), 400, true},
		{"messages wrong type", send(req("/v1/chat/completions", `{"messages":{"role":"user"}}`)), 400, true},
		{"content wrong type", send(req("/v1/chat/completions", `{"messages":[{"role":"user","content":true}]}`)), 400, true},
		{"prompt wrong type", send(req("/v1/completions", `{"prompt":true}`)), 400, true},
		{"empty body", send(req("/v1/chat/completions", ``)), 400, true},
		{"non-object body", send(req("/v1/chat/completions", `"just a string"`)), 400, true},
		{"invalid utf-8", send(req("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}")), 400, true},
		{"very deep nesting", send(req("/v1/chat/completions", `{"messages":`+strings.Repeat("[", 100000)+strings.Repeat("]", 100000)+`}`)), 400, true},
		{"million messages", send(req("/v1/chat/completions", millionMessages)), 413, true},
		{"header flood", send("GET /v1/models HTTP/1.1\r\nHost: x\r\n" + flood.String() + "\r\n"), 431, true},
		{"conflicting length and chunked", send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"), 400, true},
		{"slow headers", func(c net.Conn) {
			_, _ = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
			time.Sleep(1500 * time.Millisecond)
		}, 408, true},
		{"long url", send("GET /v1/models?" + strings.Repeat("q", 10000) + " HTTP/1.1\r\nHost: x\r\n\r\n"), 414, true},
		{"url beyond header buffer", send("GET /" + strings.Repeat("q", 40000) + " HTTP/1.1\r\nHost: x\r\n\r\n"), 431, true},
		{"garbage request line", send("\x00\x01\x02 nonsense\r\n\r\n"), 400, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := rawExchange(t, addr, c.write)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %.200s", resp.StatusCode, c.status, body)
			}
			if c.json {
				assertOpenAIError(t, body, "")
			}
		})
	}
	if n := a.Hits.Load(); n != 0 {
		t.Errorf("%d hostile requests reached the replica", n)
	}
	mustStillServe(t, k.URL)
}

// mustStillServe checks that the proxy at url still serves a plain chat
// request: bad input must hurt nobody else.
func mustStillServe(t *testing.T, url string) {
	t.Helper()
	resp, body := postJSON(t, url+"/v1/chat/completions", kvtest.ChatBody, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("after bad input: status %d %s", resp.StatusCode, body)
	}
}

func TestAPIKeys(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) { c.Auth.APIKeys = []string{"sk-first-key", "sk-second-key"} })
	for _, tc := range []struct {
		auth   string
		status int
	}{{"", 401}, {"Bearer wrong-key-0", 401}, {"Basic sk-first-key", 401}, {"Bearer sk-first-key", 200}, {"Bearer sk-second-key", 200}} {
		hdr := map[string]string{}
		if tc.auth != "" {
			hdr["Authorization"] = tc.auth
		}
		resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, hdr)
		if resp.StatusCode != tc.status {
			t.Errorf("Authorization %q: status %d, want %d (%s)", tc.auth, resp.StatusCode, tc.status, body)
		}
	}
	r, _ := a.LastRequest()
	if r.Header.Get("Authorization") != "" {
		t.Error("inbound API key forwarded to the replica")
	}
}

func TestInflightLimit(t *testing.T) {
	release := make(chan struct{})
	a := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		<-release
		kvtest.Echo(w, r, nil)
	})
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) { c.Limits.MaxInflight = 2 })
	done := make(chan int, 3)
	for i := 0; i < 3; i++ {
		go func() {
			resp, _ := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
			done <- resp.StatusCode
		}()
	}
	kvtest.WaitFor(t, 3*time.Second, "requests held", func() bool { return a.Hits.Load() >= 2 })
	time.Sleep(100 * time.Millisecond)
	resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
	close(release)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("over max_inflight: %d %s", resp.StatusCode, body)
	}
	for i := 0; i < 3; i++ {
		<-done
	}
}
