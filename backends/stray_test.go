package backends

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestFramerFindsTheEndOfEachAnswer feeds answers whole, split at every
// byte and byte by byte: the framer must end each exactly at its last
// byte, call any byte after it stray, and give up on answers it can't
// follow.
func TestFramerFindsTheEndOfEachAnswer(t *testing.T) {
	cases := []struct {
		name    string
		head    bool // answer to a HEAD request
		answer  string
		unknown bool // framing not followed: never reused
	}{
		{name: "content-length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"},
		{name: "lower-case names, spaces", answer: "HTTP/1.1 200 OK\r\ncontent-length :  3 \r\n\r\nabc"},
		{name: "empty body", answer: "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{name: "body holding a head", answer: "HTTP/1.1 200 OK\r\nContent-Length: 38\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"},
		{name: "chunked event stream", answer: "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
			chunk("data: {\"a\":1}\n\n") + chunk("data: [DONE]\n\n\n\n") + "0\r\n\r\n"},
		{name: "chunk extension and trailer", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n" +
			"A;name=value\r\n0123456789\r\n0\r\nX-Checksum: 1\r\n\r\n"},
		{name: "chunked wins over length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n"},
		{name: "no content", answer: "HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n"},
		{name: "not modified", answer: "HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n"},
		{name: "head", head: true, answer: "HTTP/1.1 200 OK\r\nContent-Length: 70\r\n\r\n"},
		{name: "interim then final", answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{name: "http/1.0 keep-alive ignores transfer-encoding", answer: "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nok"},
		{name: "empty lines first, spaces before the status", answer: "\r\n\r\nHTTP/1.1  200 OK\r\nContent-Length: 1\r\n\r\nx"},
		{name: "until close", answer: "HTTP/1.1 200 OK\r\n\r\nbody", unknown: true},
		{name: "switching protocols", answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", unknown: true},
		{name: "unknown coding", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", unknown: true},
		{name: "two lengths", answer: "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", unknown: true},
		{name: "signed length", answer: "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\nx", unknown: true},
		{name: "not http", answer: "ICY 200 OK\r\nContent-Length: 1\r\n\r\nx", unknown: true},
		{name: "chunk size without digits", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\n", unknown: true},
	}
	const extra = "HTTP/1.1 200 OK\r\nX-Injected: yes\r\n\r\n"
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			feedAll := func(parts ...string) (framer, bool) {
				var f framer
				f.start(c.head)
				stray := false
				for _, p := range parts {
					if p != "" && f.feed([]byte(p)) {
						stray = true
					}
				}
				return f, stray
			}
			want := frIdle
			if c.unknown {
				want = frUnknown
			}
			var splits [][]string
			for i := 0; i <= len(c.answer); i++ {
				splits = append(splits, []string{c.answer[:i], c.answer[i:]})
			}
			splits = append(splits, strings.Split(c.answer, ""))
			for _, parts := range splits {
				f, stray := feedAll(parts...)
				if f.state != want || stray {
					t.Fatalf("split %q: state %d stray %v, want state %d, no stray", parts, f.state, stray, want)
				}
				// The answer's own last byte must end it, not one more.
				if !c.unknown && len(parts[0]) < len(c.answer) {
					if f, _ := feedAll(c.answer[:len(c.answer)-1]); f.state == frIdle {
						t.Fatalf("ended one byte early")
					}
				}
			}
			if c.unknown {
				return
			}
			// Extra bytes in the same read as the end of the answer, and in a
			// read of their own.
			if _, stray := feedAll(c.answer + extra); !stray {
				t.Error("extra bytes in the answer's last read not found")
			}
			if _, stray := feedAll(c.answer, "x"); !stray {
				t.Error("a read after the answer not found")
			}
		})
	}
}

// chunk frames s as one chunk of a chunked body.
func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

// hostileUpstream is a replica of raw TCP (or TLS over it) whose answers
// a test writes byte for byte; it records which connection carried which
// request, and when kvroute closed each connection.
type hostileUpstream struct {
	t      *testing.T
	ln     net.Listener
	url    string
	answer func(c *hostileConn, r *http.Request)

	mu    sync.Mutex
	conns []*hostileConn
	wg    sync.WaitGroup
}

type hostileConn struct {
	id int
	net.Conn
	closed chan struct{} // closed once the other end closed the connection
	wmu    sync.Mutex
}

// write sends s on the connection (from any goroutine).
func (c *hostileConn) write(s string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = io.WriteString(c.Conn, s)
}

func startHostile(t *testing.T, tlsCfg *tls.Config, answer func(c *hostileConn, r *http.Request)) *hostileUpstream {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileUpstream{t: t, ln: ln, url: "http://" + ln.Addr().String(), answer: answer}
	if tlsCfg != nil {
		h.ln = tls.NewListener(ln, tlsCfg)
		h.url = "https://" + ln.Addr().String()
	}
	h.wg.Add(1)
	go h.accept()
	t.Cleanup(func() {
		_ = h.ln.Close()
		h.mu.Lock()
		for _, c := range h.conns {
			_ = c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	return h
}

func (h *hostileUpstream) accept() {
	defer h.wg.Done()
	for {
		conn, err := h.ln.Accept()
		if err != nil {
			return
		}
		h.mu.Lock()
		c := &hostileConn{id: len(h.conns), Conn: conn, closed: make(chan struct{})}
		h.conns = append(h.conns, c)
		h.mu.Unlock()
		h.wg.Add(1)
		go h.serve(c)
	}
}

func (h *hostileUpstream) serve(c *hostileConn) {
	defer h.wg.Done()
	defer close(c.closed)
	br := bufio.NewReader(c.Conn)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		h.answer(c, r)
	}
}

// conn returns the connection with index id.
func (h *hostileUpstream) conn(id int) *hostileConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns[id]
}

// count returns the number of connections accepted.
func (h *hostileUpstream) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// waitClosed fails the test unless kvroute closes connection id soon.
func (h *hostileUpstream) waitClosed(id int) {
	h.t.Helper()
	select {
	case <-h.conn(id).closed:
	case <-time.After(5 * time.Second):
		h.t.Fatalf("connection %d was not closed", id)
	}
}

// testReplica builds a replica of url without a fleet, so no check runs
// but the test's own.
func testReplica(t *testing.T, url string) *Replica {
	t.Helper()
	return testReplicaLogged(t, url, Options{}, zap.NewNop())
}

func testReplicaLogged(t *testing.T, url string, opts Options, log *zap.Logger) *Replica {
	t.Helper()
	o, err := opts.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Name: "h", URL: url, Engine: EngineVLLM, Models: []string{"m1"}}
	targets, err := validateSpecs([]Spec{spec})
	if err != nil {
		t.Fatal(err)
	}
	r := newReplica(0, spec, targets[0], &o, newReadTimeouts(o.FirstByteTimeout, o.StreamIdleTimeout), log)
	t.Cleanup(func() {
		r.client.CloseIdleConnections()
		r.checks.CloseIdleConnections()
	})
	return r
}

// proxyGet sends GET path through the proxy client as the proxy does (the
// body streamed, read to its end, then closed) and returns the answer.
func proxyGet(t *testing.T, r *Replica, path, tag string) (int, http.Header, string) {
	t.Helper()
	return sendGet(t, path, tag, r, func(req *fasthttp.Request, resp *fasthttp.Response) error {
		resp.StreamBody = true
		return r.Client().Do(req, resp)
	})
}

// exchangeGet is proxyGet through Replica.Exchange.
func exchangeGet(t *testing.T, r *Replica, path, tag string) (int, http.Header, string) {
	t.Helper()
	return sendGet(t, path, tag, r, func(req *fasthttp.Request, resp *fasthttp.Response) error {
		return r.Exchange(t.Context(), req, resp, 1<<20)
	})
}

// sendGet sends GET path to r, tagged with X-Tag, by do, and returns the
// answer.
func sendGet(t *testing.T, path, tag string, r *Replica, do func(*fasthttp.Request, *fasthttp.Response) error) (int, http.Header, string) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	r.SetRequestURI(req, []byte(path))
	req.Header.Set("X-Tag", tag)
	if err := do(req, resp); err != nil {
		t.Fatalf("request %s: %v", tag, err)
	}
	var body []byte
	var err error
	if bs := resp.BodyStream(); bs != nil {
		body, err = io.ReadAll(bs)
	} else {
		body = append(body, resp.Body()...)
	}
	_ = resp.CloseBodyStream()
	if err != nil {
		t.Fatalf("request %s: body: %v", tag, err)
	}
	hdr := http.Header{}
	for k, v := range resp.Header.All() {
		hdr.Add(string(k), string(v))
	}
	return resp.StatusCode(), hdr, string(body)
}

// checkGet sends GET path through the check client and returns the answer.
func checkGet(t *testing.T, r *Replica, path string) (int, http.Header, string) {
	t.Helper()
	var code int
	hdr := http.Header{}
	var body string
	err := r.get(path, "", 2*time.Second, func(resp *fasthttp.Response) error {
		code, body = resp.StatusCode(), string(resp.Body())
		for k, v := range resp.Header.All() {
			hdr.Add(string(k), string(v))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("check %s: %v", path, err)
	}
	return code, hdr, body
}

const (
	injected   = "HTTP/1.1 200 OK\r\nX-Injected: yes\r\nContent-Length: 8\r\n\r\ninjected"
	okAnswer   = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"who\":1}\n"
	cleanReply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"clean\":1}\n"
)

var sseAnswer = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
	chunk("data: {\"a\":1}\n\n") + chunk("data: [DONE]\n\n") + "0\r\n\r\n"

// attacks are the ways a replica sends bytes outside an answer; answer
// writes the answer to the first request (and what follows it), and
// injectedAt is closed once everything was written.
var attacks = []struct {
	name   string
	answer func(c *hostileConn, done chan<- struct{})
}{
	{"second response in the same write", func(c *hostileConn, done chan<- struct{}) {
		c.write(okAnswer + injected)
		close(done)
	}},
	{"second response in a write of its own", func(c *hostileConn, done chan<- struct{}) {
		// Over TLS, a record of its own: crypto/tls may hold it unread.
		c.write(okAnswer)
		c.write(injected)
		close(done)
	}},
	{"unsolicited response on the idle connection", func(c *hostileConn, done chan<- struct{}) {
		c.write(okAnswer)
		go func() {
			time.Sleep(50 * time.Millisecond)
			c.write(injected)
			close(done)
		}()
	}},
	{"streamed answer then a response", func(c *hostileConn, done chan<- struct{}) {
		c.write(sseAnswer + injected)
		close(done)
	}},
	{"streamed answer, a response while idle", func(c *hostileConn, done chan<- struct{}) {
		c.write(sseAnswer)
		go func() {
			time.Sleep(50 * time.Millisecond)
			c.write(injected)
			close(done)
		}()
	}},
	{"a response larger than the read buffer", func(c *hostileConn, done chan<- struct{}) {
		// Most of it stays in the socket after the answer is read.
		big := "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", 6000) + "\r\nContent-Length: 0\r\n\r\n"
		c.write(okAnswer + big + injected)
		close(done)
	}},
}

// TestStrayBytesNeverReachTheNextRequest runs each attack on the proxy
// client and the check client, over TCP and TLS: the next request must get
// its own clean answer on a new connection, and the connection that carried
// the stray bytes must be closed.
func TestStrayBytesNeverReachTheNextRequest(t *testing.T) {
	ca := newTestCA(t)
	cert, _, _ := ca.issue(t, false, "127.0.0.1")
	for _, useTLS := range []bool{false, true} {
		for _, client := range []string{"proxy", "exchange", "checks"} {
			for _, a := range attacks {
				name := client + "/" + a.name
				if useTLS {
					name = "tls/" + name
				}
				t.Run(name, func(t *testing.T) {
					var srvTLS *tls.Config
					var opts Options
					if useTLS {
						srvTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
						opts.TLSConfig = &tls.Config{RootCAs: ca.pool()}
					}
					done := make(chan struct{})
					var mu sync.Mutex
					first := -1
					h := startHostile(t, srvTLS, func(c *hostileConn, _ *http.Request) {
						mu.Lock()
						isFirst := first < 0
						if isFirst {
							first = c.id
						}
						mu.Unlock()
						if isFirst {
							a.answer(c, done)
							return
						}
						c.write(cleanReply)
					})
					core, logs := observer.New(zap.WarnLevel)
					r := testReplicaLogged(t, h.url, opts, zap.New(core))
					get := func(tag string) (int, http.Header, string) {
						switch client {
						case "proxy":
							return proxyGet(t, r, "/x", tag)
						case "exchange":
							return exchangeGet(t, r, "/x", tag)
						}
						return checkGet(t, r, pathHealth)
					}
					if code, _, _ := get("A"); code != 200 {
						t.Fatalf("A: status %d", code)
					}
					<-done
					time.Sleep(20 * time.Millisecond) // the last bytes reach kvroute's socket
					code, hdr, body := get("B")
					if hdr.Get("X-Injected") != "" || code != 200 || body != "{\"clean\":1}\n" {
						t.Fatalf("B got %d %v %q", code, hdr, body)
					}
					if n := h.count(); n != 2 {
						t.Fatalf("%d connections, want 2: B must come on a new one", n)
					}
					h.waitClosed(0)
					if r.ConsecutiveFailures() != 0 {
						t.Errorf("%d failures counted", r.ConsecutiveFailures())
					}
					if n := logs.FilterMessageSnippet("outside an answer").Len(); n != 1 {
						t.Errorf("%d warnings about the stray bytes, want 1", n)
					}
				})
			}
		}
	}
}

// TestCleanConnectionsAreReused is the other side: answers of every
// framing, over TCP and TLS (whose session tickets arrive outside any
// answer), keep their one connection.
func TestCleanConnectionsAreReused(t *testing.T) {
	ca := newTestCA(t)
	cert, _, _ := ca.issue(t, false, "127.0.0.1")
	answers := map[string]string{
		"/len":     okAnswer,
		"/sse":     sseAnswer,
		"/empty":   "HTTP/1.1 204 No Content\r\n\r\n",
		"/interim": "HTTP/1.1 100 Continue\r\n\r\n" + okAnswer,
		"/trailer": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
		"/health":  "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
	}
	for _, useTLS := range []bool{false, true} {
		name := "tcp"
		var srvTLS *tls.Config
		var opts Options
		if useTLS {
			name = "tls"
			srvTLS = &tls.Config{Certificates: []tls.Certificate{cert}}
			opts.TLSConfig = &tls.Config{RootCAs: ca.pool()}
		}
		t.Run(name, func(t *testing.T) {
			h := startHostile(t, srvTLS, func(c *hostileConn, r *http.Request) {
				if r.Method == http.MethodHead {
					c.write("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
					return
				}
				c.write(answers[r.URL.Path])
			})
			core, logs := observer.New(zap.WarnLevel)
			r := testReplicaLogged(t, h.url, opts, zap.New(core))
			defer func() {
				if n := logs.Len(); n != 0 {
					t.Errorf("%d warnings for clean answers: %v", n, logs.All()[0].Message)
				}
			}()
			for range 2 {
				for _, p := range []string{"/len", "/sse", "/empty", "/interim", "/trailer"} {
					if code, _, _ := proxyGet(t, r, p, p); code != 200 && code != 204 {
						t.Fatalf("%s: status %d", p, code)
					}
					time.Sleep(5 * time.Millisecond) // give session tickets time to arrive between answers
				}
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				r.SetRequestURI(req, []byte("/len"))
				req.Header.SetMethod(fasthttp.MethodHead)
				if err := r.Client().Do(req, resp); err != nil || resp.StatusCode() != 200 {
					t.Fatalf("HEAD: %v", err)
				}
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
			if n := h.count(); n != 1 {
				t.Fatalf("%d connections for sequential clean answers, want 1", n)
			}
			for range 3 {
				checkGet(t, r, pathHealth)
			}
			if n := h.count(); n != 2 {
				t.Fatalf("%d connections after the checks, want 2 (one of theirs)", n)
			}
		})
	}
}

// TestClosedIdleConnectionIsNotUsed: a replica that closes a kept-alive
// connection (its own idle timeout) costs the next request nothing, not
// even a failure counted against it.
func TestClosedIdleConnectionIsNotUsed(t *testing.T) {
	h := startHostile(t, nil, func(c *hostileConn, r *http.Request) {
		c.write(okAnswer)
		if r.Header.Get("X-Tag") == "A" {
			_ = c.Close()
		}
	})
	r := testReplica(t, h.url)
	proxyGet(t, r, "/x", "A")
	h.waitClosed(0)
	time.Sleep(20 * time.Millisecond)
	// A POST is never retried by fasthttp on its own: only the stale
	// connection check makes this one succeed.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	r.SetRequestURI(req, []byte("/x"))
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString("{}")
	if err := r.Client().Do(req, resp); err != nil || resp.StatusCode() != 200 {
		t.Fatalf("POST after the replica closed the idle connection: %v", err)
	}
	if n := h.count(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

// scriptConn is a net.Conn whose reads return the given pieces in turn,
// then io.EOF; writes are discarded.
type scriptConn struct {
	net.Conn
	pieces []string
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.pieces) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.pieces[0])
	if n == len(c.pieces[0]) {
		c.pieces = c.pieces[1:]
	} else {
		c.pieces[0] = c.pieces[0][n:]
	}
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) { return len(p), nil }

// headChecked guards c as the proxy client's dialer does: with the head
// checks.
func headChecked(c net.Conn) *strayGuard {
	g := newStrayGuard(c, nil, c, nil)
	g.fr.checkHeads = true
	return g
}

// readAll reads g until an error and returns what it delivered and the
// error, io.EOF when the script ran out.
func readAll(g net.Conn) (string, error) {
	var sb strings.Builder
	buf := make([]byte, 7) // small: heads arrive over many reads
	for {
		n, err := g.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String(), err
		}
	}
}

func TestHeadChecks(t *testing.T) {
	tests := []struct {
		name      string
		pieces    []string
		delivered string // the bytes read before the refusal
		refused   bool
	}{
		{"good head and body", []string{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\na\nb"}, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\na\nb", false},
		{"interim then final", []string{"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"}, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", false},
		{"empty line before the status line", []string{"\r\nHTTP/1.1 200 OK\r\n\r\n\n"}, "\r\nHTTP/1.1 200 OK\r\n\r\n\n", false},
		{"status 1010 is no 101", []string{"HTTP/1.1 1010 X\r\n\r\n"}, "HTTP/1.1 1010 X\r\n\r\n", false},
		{"bare LF on the status line", []string{"HTTP/1.1 200 OK\nX: y\r\n\r\n"}, "HTTP/1.1 200 OK", true},
		{"bare LF first", []string{"\nHTTP/1.1 200 OK\r\n\r\n"}, "", true},
		{"bare-LF blank line", []string{"HTTP/1.1 200 OK\r\nX: y\r\n\n"}, "HTTP/1.1 200 OK\r\nX: y\r\n", true},
		{"CR and LF in separate reads", []string{"HTTP/1.1 200 OK\r", "\nX: y\n\r\n"}, "HTTP/1.1 200 OK\r\nX: y", true},
		{"101", []string{"HTTP/1.1 101 Switching Protocols\r\n\r\n"}, "HTTP/1.1 101 Switching Protocols\r", true},
		{"101 without a reason", []string{"HTTP/1.1 101\r\n\r\n"}, "HTTP/1.1 101\r", true},
		{"101 of another version fasthttp reads", []string{"HTTP/2.0  101 X\r\n\r\n"}, "HTTP/2.0  101 X\r", true},
		{"101 split", []string{"HTTP/1.1 1", "0", "1 Switching Protocols\r", "\n\r\n"}, "HTTP/1.1 101 Switching Protocols\r", true},
		{"101 after an interim", []string{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n"}, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r", true},
		{"bare LF in an interim head", []string{"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\n\r\n"}, "HTTP/1.1 100 Continue", true},
		// Past the framer's bounds (a head over maxHead, more interim
		// heads than maxInterim) the checks go on.
		{"bare LF in a huge head", []string{"HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", maxHead) + "\nX: y\r\n\r\n"}, "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("p", maxHead), true},
		{"101 after many interims", []string{strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", maxInterim+2) + "HTTP/1.1 101 Switching Protocols\r\n\r\n"}, strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", maxInterim+2) + "HTTP/1.1 101 Switching Protocols\r", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := headChecked(&scriptConn{pieces: append([]string(nil), tt.pieces...)})
			if _, err := g.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			got, err := readAll(g)
			if got != tt.delivered {
				t.Errorf("delivered %q, want %q", got, tt.delivered)
			}
			if refused := errors.Is(err, ErrBadResponseHead); refused != tt.refused {
				t.Fatalf("read error %v, refused %v, want %v", err, refused, tt.refused)
			}
			if tt.refused {
				if _, err := g.Read(make([]byte, 8)); !errors.Is(err, ErrBadResponseHead) {
					t.Errorf("a read after the refusal: %v", err)
				}
			}
		})
	}
}

// The bytes that come with no request outstanding, and the body after a
// head, are not checked; the next request's answer is.
func TestHeadChecksHeadsOnly(t *testing.T) {
	c := &scriptConn{pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "\n\n"}}
	g := headChecked(c)
	if got, err := readAll(g); !errors.Is(err, io.EOF) || got != "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n" {
		t.Fatalf("unrequested bytes: %q %v", got, err)
	}
	// Such a connection is not reused.
	if _, err := g.Write([]byte("GET / HTTP/1.1\r\n\r\n")); !errors.Is(err, errStaleConn) {
		t.Fatalf("write after unrequested bytes: %v", err)
	}
	g = headChecked(c)
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.pieces = []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n"}
	if got, err := readAll(g); !errors.Is(err, io.EOF) || got != "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n" {
		t.Fatalf("body: %q %v", got, err)
	}
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.pieces = []string{"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\n{}"}
	if _, err := readAll(g); !errors.Is(err, ErrBadResponseHead) {
		t.Fatalf("the next head: %v", err)
	}
}

// The head checks run on every response head: they allocate nothing.
func TestHeadChecksAllocateNothing(t *testing.T) {
	answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	script := []string{answer}
	c := &scriptConn{}
	g := headChecked(c)
	req := []byte("POST / HTTP/1.1\r\n\r\n")
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		c.pieces = script
		_, _ = g.Write(req)
		if n, err := g.Read(buf); err != nil || n != len(answer) {
			t.Fatalf("read %d %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request", allocs)
	}
}
