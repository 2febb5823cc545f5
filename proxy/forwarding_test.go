package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
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

// rawRequest is one request as a raw replica read it off the wire.
type rawRequest struct {
	line     string      // request line
	head     []string    // header lines, as sent
	fields   http.Header // header fields by canonical name
	body     []byte      // decoded body
	trailers []string    // trailer-section lines of a chunked body
	chunked  bool
	conn     int // the replica connection it came on, numbered from 1
	n        int // its number among the requests read, from 1
}

// rawReplica is a replica on raw TCP. It answers kvroute's /health,
// /v1/models and /metrics checks like vLLM and every other request with
// answer, which writes whatever it likes to the connection and reports
// whether the connection may serve another request.
type rawReplica struct {
	ln     net.Listener
	answer func(c net.Conn, r *rawRequest) (keep bool)
	closed atomic.Int64 // connections ended that carried an answered request
	mu     sync.Mutex
	reqs   []*rawRequest
	conns  []net.Conn
}

func newRawReplica(t *testing.T, answer func(c net.Conn, r *rawRequest) bool) *rawReplica {
	t.Helper()
	ln := listenTCP(t, "tcp")
	r := &rawReplica{ln: ln, answer: answer}
	go r.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.conns {
			_ = c.Close()
		}
	})
	return r
}

func (r *rawReplica) url() string { return "http://" + r.ln.Addr().String() }

func (r *rawReplica) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.conns = append(r.conns, c)
		id := len(r.conns)
		r.mu.Unlock()
		go r.serveConn(c, id)
	}
}

func (r *rawReplica) serveConn(c net.Conn, id int) {
	answered := false
	defer func() {
		_ = c.Close()
		if answered {
			r.closed.Add(1)
		}
	}()
	br := bufio.NewReader(c)
	for {
		req, err := readRawRequest(br)
		if err != nil {
			return
		}
		path := strings.Fields(req.line)[1]
		switch path {
		case "/health":
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			continue
		case "/v1/models":
			body := `{"object":"list","data":[{"id":"m1","object":"model"}]}`
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			continue
		case "/metrics":
			body := "vllm:num_requests_waiting{model_name=\"m1\"} 0\nvllm:num_requests_running{model_name=\"m1\"} 0\n"
			_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			continue
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, req)
		req.conn, req.n = id, len(r.reqs)
		r.mu.Unlock()
		answered = true
		if !r.answer(c, req) {
			return
		}
	}
}

// requests returns the requests other than checks read so far.
func (r *rawReplica) requests() []*rawRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*rawRequest(nil), r.reqs...)
}

// readRawRequest reads one request, keeping its head lines as sent.
func readRawRequest(br *bufio.Reader) (*rawRequest, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return nil, err
	}
	req := &rawRequest{line: strings.TrimRight(line, "\r\n"), fields: http.Header{}}
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			return nil, err
		}
		l = strings.TrimRight(l, "\r\n")
		if l == "" {
			break
		}
		req.head = append(req.head, l)
		if k, v, ok := strings.Cut(l, ":"); ok {
			req.fields.Add(k, strings.TrimSpace(v))
		}
	}
	if strings.EqualFold(req.fields.Get("Transfer-Encoding"), "chunked") {
		req.chunked = true
		for {
			sz, err := br.ReadString('\n')
			if err != nil {
				return nil, err
			}
			n, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(sz, ";", 2)[0]), 16, 64)
			if err != nil {
				return nil, err
			}
			if n == 0 {
				break
			}
			chunk := make([]byte, n+2)
			if _, err := io.ReadFull(br, chunk); err != nil {
				return nil, err
			}
			req.body = append(req.body, chunk[:n]...)
		}
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return nil, err
			}
			if l = strings.TrimRight(l, "\r\n"); l == "" {
				break
			}
			req.trailers = append(req.trailers, l)
		}
	} else if cl := req.fields.Get("Content-Length"); cl != "" {
		n, err := strconv.Atoi(cl)
		if err != nil {
			return nil, err
		}
		req.body = make([]byte, n)
		if _, err := io.ReadFull(br, req.body); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// answerJSON answers a request with a small JSON completion.
func answerJSON(c net.Conn, _ *rawRequest) bool {
	body := `{"id":"x","object":"chat.completion"}`
	_, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return err == nil
}

// startRaw runs kvroute, logging to an observer, in front of the raw
// replica rep.
func startRaw(t *testing.T, rep *rawReplica, opts ...kvtest.Option) (*kvtest.KV, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	opts = append([]kvtest.Option{func(c *config.Config) {
		c.Backends = []config.Backend{{Name: "raw", URL: rep.url(), Engine: "vllm"}}
	}}, opts...)
	return kvtest.StartLogged(t, zap.New(core), nil, opts...), logs
}

// TestForwardedAsTheReplicaExpects sends requests in shapes a client may
// choose and checks what the replica reads.
func TestForwardedAsTheReplicaExpects(t *testing.T) {
	rep := newRawReplica(t, answerJSON)
	k, _ := startRaw(t, rep)
	addr := strings.TrimPrefix(k.URL, "http://")
	repAddr := strings.TrimPrefix(rep.url(), "http://")
	body := kvtest.ChatBody
	// forwardedAs checks the replica got line as its request line and its
	// own address as the one Host.
	forwardedAs := func(t *testing.T, r *rawRequest, line string) {
		t.Helper()
		if r.line != line {
			t.Errorf("request line %q, want %s", r.line, line)
		}
		if h := r.fields.Values("Host"); len(h) != 1 || h[0] != repAddr {
			t.Errorf("Host %q, want %q", h, repAddr)
		}
	}
	cases := []struct {
		name  string
		req   string
		check func(t *testing.T, r *rawRequest)
	}{
		{
			name:  "absolute-form target",
			req:   "GET http://evil.example:9999/x?q=1 HTTP/1.1\r\nHost: evil.example:9999\r\n\r\n",
			check: func(t *testing.T, r *rawRequest) { forwardedAs(t, r, "GET /x?q=1 HTTP/1.1") },
		},
		{
			name:  "absolute-form https target",
			req:   "GET HTTPS://evil.example/v1/files/f1 HTTP/1.1\r\nHost: kvroute.example\r\n\r\n",
			check: func(t *testing.T, r *rawRequest) { forwardedAs(t, r, "GET /v1/files/f1 HTTP/1.1") },
		},
		{
			name: "absolute-form target with user info and no path",
			req:  "GET http://user:secret@evil.example:9999?q=1 HTTP/1.1\r\nHost: evil.example:9999\r\n\r\n",
			check: func(t *testing.T, r *rawRequest) {
				forwardedAs(t, r, "GET /?q=1 HTTP/1.1")
				if a := r.fields.Get("Authorization"); a != "" {
					t.Errorf("Authorization %q made from the target's user info", a)
				}
			},
		},
		{
			name:  "authority in the path",
			req:   "GET //evil.example:9999/x HTTP/1.1\r\nHost: evil.example:9999\r\n\r\n",
			check: func(t *testing.T, r *rawRequest) { forwardedAs(t, r, "GET //evil.example:9999/x HTTP/1.1") },
		},
		{
			name: "POST without Content-Type",
			req:  fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body),
			check: func(t *testing.T, r *rawRequest) {
				if ct, ok := r.fields["Content-Type"]; ok {
					t.Errorf("Content-Type %q forwarded, the client sent none", ct)
				}
				if string(r.body) != body {
					t.Errorf("body %q", r.body)
				}
			},
		},
		{
			name: "POST with Content-Type",
			req:  fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: %d\r\n\r\n%s", len(body), body),
			check: func(t *testing.T, r *rawRequest) {
				if ct := r.fields.Values("Content-Type"); len(ct) != 1 || ct[0] != "application/json; charset=utf-8" {
					t.Errorf("Content-Type %q", ct)
				}
			},
		},
		{
			name: "chunked request with trailers",
			req: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum, X-Sig\r\nX-Sig: upfront\r\nUser-Agent: ua/1\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Checksum: abc\r\nX-Sig: late\r\nX-Late: 1\r\nUser-Agent: late\r\n\r\n", len(body), body),
			check: func(t *testing.T, r *rawRequest) {
				for _, name := range []string{"X-Checksum", "X-Late"} {
					if v, ok := r.fields[name]; ok {
						t.Errorf("trailer %s forwarded as a header: %q", name, v)
					}
				}
				if v := r.fields.Values("X-Sig"); len(v) != 1 || v[0] != "upfront" {
					t.Errorf("X-Sig %q, want the header-section value only", v)
				}
				if v := r.fields.Values("User-Agent"); len(v) != 1 || v[0] != "ua/1" {
					t.Errorf("User-Agent %q, want the header-section value only", v)
				}
				if len(r.trailers) != 0 {
					t.Errorf("trailers forwarded: %q", r.trailers)
				}
				if string(r.body) != body {
					t.Errorf("body %q", r.body)
				}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(rep.requests())
			resp, rbody := rawExchange(t, addr, func(conn net.Conn) { _, _ = io.WriteString(conn, c.req) })
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, rbody)
			}
			reqs := rep.requests()
			if len(reqs) != before+1 {
				t.Fatalf("%d requests reached the replica, want 1", len(reqs)-before)
			}
			r := reqs[len(reqs)-1]
			t.Logf("replica read %q %q trailers %q", r.line, r.head, r.trailers)
			c.check(t, r)
		})
	}
}

// Requests kvroute does not forward, whatever their path, are answered by
// kvroute itself in OpenAI JSON, logged and counted like its other own
// answers; the methods it allows reach the replica.
func TestUnforwardableRequestsRefused(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{a})
	addr := strings.TrimPrefix(k.URL, "http://")
	cases := []struct {
		name, method, head string // head: request line and header lines, without the blank line
		status             int
		code               string
	}{
		{"CONNECT", "CONNECT", "CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443", 405, "method_not_allowed"},
		{"TRACE", "TRACE", "TRACE /v1/models HTTP/1.1\r\nHost: x", 405, "method_not_allowed"},
		{"WebDAV method", "PROPFIND", "PROPFIND /v1/files HTTP/1.1\r\nHost: x", 405, "method_not_allowed"},
		{"lower-case method", "post", "post /v1/x HTTP/1.1\r\nHost: x", 405, "method_not_allowed"},
		{"space inside a header name", "GET", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX Bad: 1", 400, "bad_header_name"},
		{"space inside a header name, before a good one", "POST", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX Session Id: 1\r\nContent-Type: application/json\r\nContent-Length: 0", 400, "bad_header_name"},
		{"GET", "GET", "GET /v1/x HTTP/1.1\r\nHost: x", 200, ""},
		{"HEAD", "HEAD", "HEAD /v1/x HTTP/1.1\r\nHost: x", 200, ""},
		{"PUT", "PUT", "PUT /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0", 200, ""},
		{"DELETE", "DELETE", "DELETE /v1/x HTTP/1.1\r\nHost: x", 200, ""},
		{"PATCH", "PATCH", "PATCH /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0", 200, ""},
		{"OPTIONS", "OPTIONS", "OPTIONS /v1/x HTTP/1.1\r\nHost: x", 200, ""},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id := fmt.Sprintf("refused-%d", i)
			hits, lines, counts := a.Hits.Load(), len(accessLog(logs)), requestCounts(t, k.Admin)
			conn := dialTCP(t, addr)
			defer func() { _ = conn.Close() }()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(conn, c.head+"\r\nX-Request-Id: "+id+"\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			req := &http.Request{Method: c.method}
			resp, err := http.ReadResponse(bufio.NewReader(conn), req)
			if err != nil {
				t.Fatalf("no HTTP response: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, body)
			}
			if c.status == 200 {
				if a.Hits.Load() != hits+1 {
					t.Errorf("%s did not reach the replica", c.method)
				}
				return
			}
			assertOpenAIError(t, body, c.code)
			if got := resp.Header.Get("X-Request-Id"); got != id {
				t.Errorf("X-Request-Id %q, want %q", got, id)
			}
			if c.status == 405 && resp.Header.Get("Allow") != "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS" {
				t.Errorf("Allow %q", resp.Header.Get("Allow"))
			}
			if a.Hits.Load() != hits {
				t.Errorf("a refused %s reached the replica", c.method)
			}
			var mine []observer.LoggedEntry
			kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool {
				mine = mine[:0]
				for _, e := range accessLog(logs)[lines:] {
					if e.ContextMap()["request_id"] == id {
						mine = append(mine, e)
					}
				}
				return len(mine) > 0
			})
			if len(mine) != 1 {
				t.Fatalf("%d access-log lines, want 1", len(mine))
			}
			f := mine[0].ContextMap()
			if f["status"] != int64(c.status) || f["method"] != c.method || f["error"] != c.code {
				t.Errorf("logged status %v method %v error %v", f["status"], f["method"], f["error"])
			}
			after := requestCounts(t, k.Admin)
			if d := after[fmt.Sprint(c.status)] - counts[fmt.Sprint(c.status)]; d != 1 {
				t.Errorf("kvroute_requests_total{status=%q} moved by %v, want 1", fmt.Sprint(c.status), d)
			}
		})
	}
	mustStillServe(t, k.URL)
}

// A replica's answer kvroute cannot relay as HTTP/1.1 fails at once with a
// 502, and the replica connection that carried it is closed, never used
// again: a protocol switch, or a head with bare-LF line ends, which
// fasthttp would wait on until timeouts.first_byte (30 s here). RFC 9112
// §2.2 lets a recipient accept a bare LF; kvroute refuses it, as it does
// any head two parsers could read differently.
func TestBadReplicaHeadsFailFast(t *testing.T) {
	cases := []struct {
		name   string
		answer []string // written in turn, a moment apart
		status int
		body   string // the body relayed, for a 200
	}{
		{"101 Switching Protocols", []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"}, 502, ""},
		{"101 after 100 Continue", []string{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"}, 502, ""},
		{"101 in pieces", []string{"HTTP/1.1 1", "01 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"}, 502, ""},
		{"bare-LF head", []string{"HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n{}"}, 502, ""},
		{"bare LF after a CRLF line", []string{"HTTP/1.1 200 OK\r\nContent-Type: application/json\nContent-Length: 2\r\n\r\n{}"}, 502, ""},
		{"bare-LF blank line", []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\n{}"}, 502, ""},
		{"bare LF in pieces", []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r", "\n\n{}"}, 502, ""},
		{"100 Continue then 200", []string{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"}, 200, "{}"},
		{"bare LF in the body", []string{"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\na\nb"}, 200, "a\nb"},
	}
	post := func(conn net.Conn) {
		_, _ = fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
			len(kvtest.ChatBody), kvtest.ChatBody)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The first request gets the answer under test, the next ones
			// a good one, on whatever connection they come.
			rep := newRawReplica(t, func(conn net.Conn, r *rawRequest) bool {
				if r.n > 1 {
					return answerJSON(conn, r)
				}
				for i, piece := range c.answer {
					if i > 0 {
						time.Sleep(50 * time.Millisecond)
					}
					_, _ = io.WriteString(conn, piece)
				}
				return true // and read on: kvroute must close the connection
			})
			k, logs := startRaw(t, rep, func(cfg *config.Config) {
				cfg.Timeouts.FirstByte, cfg.Timeouts.StreamIdle = 30*time.Second, 30*time.Second
				cfg.Health.FailThreshold = 3 // one bad answer leaves the replica in service
			})
			addr := strings.TrimPrefix(k.URL, "http://")
			start := time.Now()
			resp, body := rawExchange(t, addr, post)
			took := time.Since(start)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %q", resp.StatusCode, c.status, body)
			}
			if c.status == 200 {
				if string(body) != c.body {
					t.Errorf("body %q, want %q", body, c.body)
				}
				return
			}
			// A bound of correctness, far below the 30 s first-byte wait.
			if took > 5*time.Second {
				t.Errorf("answered after %v", took)
			}
			assertOpenAIError(t, body, "replica_bad_response")
			kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool {
				for _, e := range accessLog(logs) {
					if f := e.ContextMap(); f["status"] == int64(502) && f["replica"] == "raw" && f["error"] == "replica_bad_response" {
						return true
					}
				}
				return false
			})
			// The next request is served, on another connection.
			if resp, body := rawExchange(t, addr, post); resp.StatusCode != 200 {
				t.Fatalf("next request: status %d: %s", resp.StatusCode, body)
			}
			reqs := rep.requests()
			if len(reqs) != 2 || reqs[1].conn == reqs[0].conn {
				t.Errorf("the next request came on the refused answer's connection")
			}
			kvtest.WaitFor(t, 5*time.Second, "the refused connection closed", func() bool { return rep.closed.Load() >= 1 })
		})
	}
}
