package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// strayUpstream is a replica of raw TCP with hand-written HTTP/1.1
// answers. It serves the checks itself and hands each proxied request, by
// its X-Tag header, to the test's answer; it records which connection
// carried which tag and when kvroute closed each connection.
type strayUpstream struct {
	ln     net.Listener
	answer func(c *strayConn, tag string)

	mu    sync.Mutex
	conns []*strayConn
	tags  map[string]int // tag → connection index
	wg    sync.WaitGroup
}

type strayConn struct {
	net.Conn
	id     int
	closed chan struct{} // closed once kvroute closed the connection
	wmu    sync.Mutex
}

func (c *strayConn) write(s string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = io.WriteString(c.Conn, s)
}

func startStrayUpstream(t *testing.T, answer func(c *strayConn, tag string)) *strayUpstream {
	t.Helper()
	ln := listenTCP(t, "tcp4")
	u := &strayUpstream{ln: ln, answer: answer, tags: map[string]int{}}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			c := &strayConn{Conn: conn, id: len(u.conns), closed: make(chan struct{})}
			u.conns = append(u.conns, c)
			u.mu.Unlock()
			u.wg.Add(1)
			go u.serve(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		u.mu.Lock()
		for _, c := range u.conns {
			_ = c.Close()
		}
		u.mu.Unlock()
		u.wg.Wait()
	})
	return u
}

const strayMetrics = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0\n"

func (u *strayUpstream) serve(c *strayConn) {
	defer u.wg.Done()
	defer close(c.closed)
	br := bufio.NewReader(c.Conn)
	for {
		r, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		switch r.URL.Path {
		case "/health":
			c.write("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
		case "/metrics":
			c.write(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(strayMetrics), strayMetrics))
		default:
			tag := r.Header.Get("X-Tag")
			u.mu.Lock()
			u.tags[tag] = c.id
			u.mu.Unlock()
			u.answer(c, tag)
		}
	}
}

// connOf returns the connection that carried the request tagged tag.
func (u *strayUpstream) connOf(t *testing.T, tag string) *strayConn {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	id, ok := u.tags[tag]
	if !ok {
		t.Fatalf("request %s never reached the replica", tag)
	}
	return u.conns[id]
}

func sseChunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

const (
	strayInjected = "HTTP/1.1 200 OK\r\nX-Injected: yes\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"injected\":true}"
	strayAnswerA  = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{\"who\":1}"
	strayAnswerB  = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"clean\":1}"
)

var straySSE = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n" +
	sseChunk("data: {\"choices\":[]}\n\n") + sseChunk("data: [DONE]\n\n") + "0\r\n\r\n"

// TestKeptAliveConnectionsCarryNothingStray: a replica that writes a second
// response after its answer, in the same write, on the idle connection
// later, or after a streamed answer, must not have it delivered to another
// client's request: that request gets its own answer on a new connection,
// and the connection that carried the stray bytes is closed.
func TestKeptAliveConnectionsCarryNothingStray(t *testing.T) {
	cases := []struct {
		name   string
		stream bool
		answer func(c *strayConn, done chan<- struct{})
	}{
		{"second response in the same write", false, func(c *strayConn, done chan<- struct{}) {
			c.write(strayAnswerA + strayInjected)
			close(done)
		}},
		{"unsolicited response on the idle connection", false, func(c *strayConn, done chan<- struct{}) {
			c.write(strayAnswerA)
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.write(strayInjected)
				close(done)
			}()
		}},
		{"streamed answer then a response", true, func(c *strayConn, done chan<- struct{}) {
			c.write(straySSE + strayInjected)
			close(done)
		}},
		{"streamed answer, a response later", true, func(c *strayConn, done chan<- struct{}) {
			c.write(straySSE)
			go func() {
				time.Sleep(50 * time.Millisecond)
				c.write(strayInjected)
				close(done)
			}()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan struct{})
			u := startStrayUpstream(t, func(c *strayConn, tag string) {
				if tag == "A" {
					tc.answer(c, done)
					return
				}
				c.write(strayAnswerB)
			})
			k := kvtest.Start(t, nil, func(c *config.Config) {
				c.Backends = []config.Backend{{Name: "h", URL: "http://" + u.ln.Addr().String(), Engine: "vllm", Models: []string{"m1"}}}
			})
			// Two clients, each on its own connection to kvroute.
			// send returns the answer's status, headers and body.
			send := func(tag string) (int, http.Header, string) {
				cl := &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
				defer cl.CloseIdleConnections()
				body := kvtest.ChatBody
				if tc.stream && tag == "A" {
					body = strings.Replace(body, `{`, `{"stream":true,`, 1)
				}
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Tag", tag)
				resp, err := cl.Do(req)
				if err != nil {
					t.Fatalf("request %s: %v", tag, err)
				}
				defer func() { _ = resp.Body.Close() }()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("request %s: body: %v", tag, err)
				}
				return resp.StatusCode, resp.Header, string(b)
			}
			if status, _, body := send("A"); status != 200 {
				t.Fatalf("A: %d %s", status, body)
			}
			<-done
			time.Sleep(20 * time.Millisecond) // the last bytes reach kvroute's socket
			status, hdr, body := send("B")
			if hdr.Get("X-Injected") != "" || strings.Contains(body, "injected") {
				t.Fatalf("B was given the stray response: %v %s", hdr, body)
			}
			if status != 200 || body != `{"clean":1}` {
				t.Fatalf("B: %d %s", status, body)
			}
			a, b := u.connOf(t, "A"), u.connOf(t, "B")
			if a == b {
				t.Fatal("B was sent on the connection that carried stray bytes")
			}
			select {
			case <-a.closed:
			case <-time.After(5 * time.Second):
				t.Fatal("the connection that carried stray bytes was not closed")
			}
			if r := k.Srv.Fleet.ByName("h"); !r.Healthy() || r.ConsecutiveFailures() != 0 {
				t.Errorf("replica healthy %v, %d failures", r.Healthy(), r.ConsecutiveFailures())
			}
		})
	}
}
