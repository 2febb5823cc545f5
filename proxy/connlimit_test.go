package proxy_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// clientConn is one client connection to kvroute, kept open between
// requests.
type clientConn struct {
	net.Conn
	br *bufio.Reader
}

// dialer opens client connections to a kvroute, over TLS when the
// configuration serves it.
type dialer func(t *testing.T) *clientConn

func plainDialer(addr string) dialer {
	return func(t *testing.T) *clientConn {
		t.Helper()
		c := dialTCP(t, addr)
		t.Cleanup(func() { _ = c.Close() })
		return &clientConn{Conn: c, br: bufio.NewReader(c)}
	}
}

func tlsDialer(addr string, ca *kvtest.CA) dialer {
	return func(t *testing.T) *clientConn {
		t.Helper()
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
			Config: &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}}
		c, err := d.DialContext(t.Context(), "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return &clientConn{Conn: c, br: bufio.NewReader(c)}
	}
}

// chatRequest is a keep-alive chat request carrying id as X-Request-Id.
func chatRequest(id string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nUser-Agent: cap-test\r\n" +
		"X-Request-Id: " + id + "\r\nContent-Length: " + strconv.Itoa(len(kvtest.ChatBody)) + "\r\n\r\n" + kvtest.ChatBody
}

// do sends raw (nothing when empty) on c and reads one response, whose
// body it reads and closes.
//
//bodyclose:handled
func (c *clientConn) do(t *testing.T, raw string) (*http.Response, []byte) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if raw != "" {
		if _, err := io.WriteString(c, raw); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatalf("no HTTP response: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp, body
}

// closedByServer reports whether the server closed c within d: a read
// gets the end of the stream (or a reset) rather than a timeout.
func (c *clientConn) closedByServer(d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.br.ReadByte()
	var ne net.Error
	return err != nil && (!errors.As(err, &ne) || !ne.Timeout())
}

// linesWithID returns the access-log lines after the first skip ones whose
// request_id is id.
func linesWithID(logs *observer.ObservedLogs, skip int, id string) []observer.LoggedEntry {
	var out []observer.LoggedEntry
	for _, e := range accessLog(logs)[skip:] {
		if e.ContextMap()["request_id"] == id {
			out = append(out, e)
		}
	}
	return out
}

// A connection over limits.max_connections gets a whole HTTP/1.1 503 with
// an OpenAI error body, Retry-After and Connection: close, over TLS too,
// and one access-log line and one request sample like any answer; a
// connection that closes makes room for exactly one more.
func TestConnectionCapAnswersInOpenAIJSON(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"plain", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			var ca *kvtest.CA
			var leaf kvtest.Leaf
			if tc.tls {
				ca = kvtest.NewCA(t)
				leaf = ca.Server(t, "127.0.0.1")
			}
			core, logs := observer.New(zapcore.InfoLevel)
			a := kvtest.NewReplica(t, "a", nil)
			k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{a}, func(c *config.Config) {
				c.Limits.MaxConnections = 2
				if tc.tls {
					c.TLS.CertFile, c.TLS.KeyFile = leaf.CertFile, leaf.KeyFile
				}
			})
			addr := strings.TrimPrefix(k.URL, "http://")
			dial := plainDialer(addr)
			if tc.tls {
				dial = tlsDialer(addr, ca)
			}
			served := func(c *clientConn, id string) {
				t.Helper()
				if resp, body := c.do(t, chatRequest(id)); resp.StatusCode != 200 {
					t.Fatalf("%s: status %d: %s", id, resp.StatusCode, body)
				}
			}
			// rejected checks the answer to a connection over the cap and
			// its one access-log line and sample.
			rejected := func(id, raw string) {
				t.Helper()
				lines, counts := len(accessLog(logs)), requestCounts(t, k.Admin)
				c := dial(t)
				resp, body := c.do(t, raw)
				if resp.StatusCode != http.StatusServiceUnavailable || resp.ProtoMajor != 1 || resp.ProtoMinor != 1 {
					t.Fatalf("%s %d: %s", resp.Proto, resp.StatusCode, body)
				}
				assertOpenAIError(t, body, "too_many_connections")
				if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
				if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
					t.Errorf("Retry-After %q, want a positive number of seconds", resp.Header.Get("Retry-After"))
				}
				if !resp.Close { // net/http takes "close" out of the Connection header into Close
					t.Error("no Connection: close")
				}
				if resp.ContentLength != int64(len(body)) {
					t.Errorf("Content-Length %d for a body of %d bytes", resp.ContentLength, len(body))
				}
				if !c.closedByServer(5 * time.Second) {
					t.Error("the rejected connection was not closed")
				}
				logID := id
				if raw == "" {
					logID = resp.Header.Get("X-Request-Id") // generated
				} else if got := resp.Header.Get("X-Request-Id"); got != id {
					t.Errorf("X-Request-Id %q, want %q", got, id)
				}
				var mine []observer.LoggedEntry
				kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool {
					mine = linesWithID(logs, lines, logID)
					return len(mine) > 0
				})
				if len(mine) != 1 || len(accessLog(logs)) != lines+1 {
					t.Fatalf("%d lines for the rejection, %d in all, want 1: %v", len(mine), len(accessLog(logs))-lines, mine)
				}
				f := mine[0].ContextMap()
				if f["status"] != int64(503) || f["error"] != "too_many_connections" || f["bytes"] != int64(len(body)) {
					t.Errorf("status %v error %v bytes %v (body %d bytes)", f["status"], f["error"], f["bytes"], len(body))
				}
				if client, _ := f["client"].(string); !strings.HasPrefix(client, "127.0.0.1:") {
					t.Errorf("client %q", client)
				}
				wantMethod, wantPath, wantUA := "POST", "/v1/chat/completions", "cap-test"
				if raw == "" {
					wantMethod, wantPath, wantUA = "", "", ""
				}
				if f["method"] != wantMethod || f["path"] != wantPath || f["user_agent"] != wantUA {
					t.Errorf("method %q path %q user_agent %q, want %q %q %q", f["method"], f["path"], f["user_agent"], wantMethod, wantPath, wantUA)
				}
				after := requestCounts(t, k.Admin)
				if d := after["503"] - counts["503"]; d != 1 || total(after)-total(counts) != 1 {
					t.Errorf("kvroute_requests_total{status=\"503\"} moved by %v (all by %v), want 1", d, total(after)-total(counts))
				}
			}

			c1, c2 := dial(t), dial(t)
			served(c1, "cap-c1")
			served(c2, "cap-c2")
			rejected("cap-over", chatRequest("cap-over"))
			rejected("", "") // a client that sends nothing still gets its answer
			if n := k.Srv.Proxy.OpenConns(); n != 2 {
				t.Fatalf("OpenConns %d, want 2", n)
			}
			served(c1, "cap-c1-again")

			_ = c1.Close()
			kvtest.WaitFor(t, 5*time.Second, "the closed connection to be counted out", func() bool { return k.Srv.Proxy.OpenConns() == 1 })
			c3 := dial(t)
			served(c3, "cap-c3")
			// Counted out once: the cap holds again with c2 and c3 open.
			rejected("cap-over-again", chatRequest("cap-over-again"))
			served(c2, "cap-c2-again")
			if n := k.Srv.Proxy.OpenConns(); n != 2 {
				t.Errorf("OpenConns %d, want 2", n)
			}
		})
	}
}

// timeouts.client_idle closes a kept-alive connection that sends no next
// request; each connection fasthttp closes that way is counted out once.
func TestClientIdleClosesKeptAliveConnections(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a}, func(c *config.Config) {
		c.Timeouts.ClientIdle = 300 * time.Millisecond
		c.Limits.MaxConnections = 2
	})
	dial := plainDialer(strings.TrimPrefix(k.URL, "http://"))
	for round := 0; round < 2; round++ {
		c1, c2 := dial(t), dial(t)
		for _, c := range []*clientConn{c1, c2} {
			if resp, body := c.do(t, chatRequest("idle")); resp.StatusCode != 200 || resp.Close {
				t.Fatalf("status %d close %v: %s", resp.StatusCode, resp.Close, body)
			}
		}
		for i, c := range []*clientConn{c1, c2} {
			if !c.closedByServer(5 * time.Second) {
				t.Fatalf("round %d: connection %d still open 5s after its answer with timeouts.client_idle 300ms", round, i+1)
			}
		}
		kvtest.WaitFor(t, 5*time.Second, "the idle connections to be counted out", func() bool { return k.Srv.Proxy.OpenConns() == 0 })
	}
	// Counted out exactly once each: two fit again, a third does not.
	c1, c2, c3 := dial(t), dial(t), dial(t)
	for _, c := range []*clientConn{c1, c2} {
		if resp, _ := c.do(t, chatRequest("idle-after")); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if resp, body := c3.do(t, chatRequest("idle-over")); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third connection: status %d: %s", resp.StatusCode, body)
	}
}

// A connection closed twice (a cut stream's, then fasthttp's) is counted
// out once.
func TestLimitListenerCountsAConnectionOutOnce(t *testing.T) {
	a := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{a})
	raw := listenTCP(t, "tcp")
	ln := k.Srv.Proxy.LimitListener(raw)
	defer func() { _ = ln.Close() }()
	cl := dialTCP(t, raw.Addr().String())
	defer func() { _ = cl.Close() }()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if n := k.Srv.Proxy.OpenConns(); n != 1 {
		t.Fatalf("OpenConns %d after Accept, want 1", n)
	}
	_ = c.Close()
	_ = c.Close()
	if n := k.Srv.Proxy.OpenConns(); n != 0 {
		t.Fatalf("OpenConns %d after two Closes, want 0", n)
	}
	if _, isTLS := c.(interface{ ConnectionState() tls.ConnectionState }); isTLS {
		t.Error("a plain connection looks like TLS")
	}
	_ = ln.Close()
	if _, err := ln.Accept(); err == nil {
		t.Error("Accept after Close succeeded")
	}
}
