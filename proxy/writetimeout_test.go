package proxy_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// stalledClient sends one raw request to kvroute at addr and never reads
// the answer; its receive buffer is made small, so kvroute's writes to it
// block once the socket buffers are full. The connection closes when the
// test ends.
func stalledClient(t *testing.T, addr, path, body string) net.Conn {
	t.Helper()
	return stalledClientTLS(t, addr, path, body, nil)
}

// stalledClientTLS is stalledClient over TLS when tc is not nil.
func stalledClientTLS(t *testing.T, addr, path, body string, tc *tls.Config) net.Conn {
	t.Helper()
	tcp := dialTCP(t, addr)
	t.Cleanup(func() { _ = tcp.Close() })
	if err := tcp.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	conn := tcp
	if tc != nil {
		tconn := tls.Client(tcp, tc)
		_ = tconn.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tconn.HandshakeContext(t.Context()); err != nil {
			t.Fatal(err)
		}
		conn = tconn
	}
	req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn
}

// accessLines returns the access-log entries ("request") in logs.
func accessLines(logs *observer.ObservedLogs) []map[string]any {
	entries := logs.FilterLoggerName("access").FilterMessage("request").All()
	out := make([]map[string]any, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.ContextMap())
	}
	return out
}

// piece is what the fake replicas below write at a time.
var piece = []byte(strings.Repeat("0123456789abcdef", 4096)) // 64 KiB

// A client that stops reading its answer is cut after timeouts.client_write:
// the request ends, its replica connection is closed (the engine sees its
// request canceled and stops generating), its in-flight slots are freed, and
// it is logged once with error client_write_timeout and the status it was
// sent; the replica is not charged a failure.
func TestClientWriteTimeoutEndsUnreadAnswer(t *testing.T) {
	const answerBytes = 10 << 20
	cases := []struct {
		name    string
		body    string
		handler func(canceled *atomic.Bool) http.HandlerFunc
	}{
		{
			// A 10 MB answer of known length: all but its last byte is sent
			// at once, the last only when the client took the rest (socket
			// buffers on loopback could otherwise hold all of it, and the
			// replica would be done before kvroute gave up).
			name: "10 MB answer",
			body: kvtest.ChatBody,
			handler: func(canceled *atomic.Bool) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.Header().Set("Content-Length", strconv.Itoa(answerBytes))
					left := answerBytes - 1
					for left > 0 {
						n := min(left, len(piece))
						if _, err := w.Write(piece[:n]); err != nil {
							canceled.Store(true)
							return
						}
						left -= n
					}
					select {
					case <-r.Context().Done():
						canceled.Store(true)
					case <-time.After(20 * time.Second):
						_, _ = w.Write([]byte("x"))
					}
				}
			},
		},
		{
			// An SSE stream that never ends while the replica can write.
			name: "endless stream",
			body: `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hello"}]}`,
			handler: func(canceled *atomic.Bool) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					w.Header().Set("Content-Type", "text/event-stream")
					event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("t", 1000) + "\"}}]}\n\n")
					deadline := time.Now().Add(20 * time.Second)
					for time.Now().Before(deadline) {
						if _, err := w.Write(event); err != nil {
							canceled.Store(true)
							return
						}
						w.(http.Flusher).Flush()
						if r.Context().Err() != nil {
							canceled.Store(true)
							return
						}
					}
				}
			},
		},
	}
	for _, c := range cases {
		for _, overTLS := range []bool{false, true} {
			name := c.name
			if overTLS {
				name += " over TLS"
			}
			t.Run(name, func(t *testing.T) {
				var canceled atomic.Bool
				rep := kvtest.NewReplica(t, "a", c.handler(&canceled))
				var tc *tls.Config
				var leaf kvtest.Leaf
				if overTLS {
					ca := kvtest.NewCA(t)
					leaf = ca.Server(t, "127.0.0.1")
					tc = &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
				}
				core, logs := observer.New(zapcore.InfoLevel)
				k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{rep}, func(cfg *config.Config) {
					cfg.Timeouts.ClientWrite = 500 * time.Millisecond
					cfg.Timeouts.StreamIdle = 30 * time.Second
					if overTLS {
						cfg.TLS.CertFile, cfg.TLS.KeyFile = leaf.CertFile, leaf.KeyFile
					}
				})
				stalledClientTLS(t, strings.TrimPrefix(k.URL, "http://"), "/v1/chat/completions", c.body, tc)

				r := k.Srv.Fleet.ByName("a")
				kvtest.WaitFor(t, 10*time.Second, "the replica to see its request canceled", canceled.Load)
				kvtest.WaitFor(t, 5*time.Second, "kvroute's and the replica's in-flight counts to return to 0", func() bool {
					return k.Srv.Proxy.InFlight() == 0 && r.InFlight() == 0
				})
				// finish counts the request out just before it logs it.
				var cut []map[string]any
				kvtest.WaitFor(t, 5*time.Second, "the access-log line", func() bool {
					cut = cut[:0]
					for _, f := range accessLines(logs) {
						if f["path"] == "/v1/chat/completions" {
							cut = append(cut, f)
						}
					}
					return len(cut) > 0
				})
				time.Sleep(100 * time.Millisecond) // a second line would be there by now
				cut = cut[:0]
				for _, f := range accessLines(logs) {
					if f["path"] == "/v1/chat/completions" {
						cut = append(cut, f)
					}
				}
				if len(cut) != 1 {
					t.Fatalf("want one access-log line for the request, got %v", cut)
				}
				if cut[0]["error"] != "client_write_timeout" || cut[0]["status"] != int64(200) {
					t.Errorf("access log: want error client_write_timeout with status 200 (as sent), got %v", cut[0])
				}
				if n := k.Srv.Proxy.ClientWriteTimeouts(); n != 1 {
					t.Errorf("ClientWriteTimeouts() = %d, want 1", n)
				}
				if got := counterBy(t, k.Admin, "kvroute_client_write_timeouts_total", "backend"); got["a"] != 1 {
					t.Errorf("kvroute_client_write_timeouts_total by backend = %v, want a: 1", got)
				}
				if n := r.ConsecutiveFailures(); n != 0 || !r.Healthy() {
					t.Errorf("replica charged for a slow client: %d failures, healthy %v", n, r.Healthy())
				}
			})
		}
	}
}

// timeouts.client_write bounds each write, not the answer: a stream that
// lasts longer, and a large answer its client reads slowly but steadily,
// are delivered whole.
func TestClientWriteTimeoutSparesSteadyReaders(t *testing.T) {
	const events = 15
	stream := kvtest.NewReplica(t, "stream", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < events; i++ {
			_, _ = fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	})
	large := patterned(8 << 20)
	big := kvtest.NewReplica(t, "big", bigAnswer(large))
	for _, c := range []struct {
		rep  *kvtest.Replica
		want []byte
		read func(io.Reader) ([]byte, error)
	}{
		{stream, nil, io.ReadAll},
		{big, large, func(r io.Reader) ([]byte, error) {
			// 256 KiB every 100 ms: the answer takes over 3 s, three
			// times timeouts.client_write, while no write waits longer
			// than a tenth of it on a quiet machine (a loaded one, with
			// the race detector, has stalled this reader for 400 ms).
			var out []byte
			buf := make([]byte, 256<<10)
			for {
				n, err := io.ReadFull(r, buf)
				out = append(out, buf[:n]...)
				if err == io.EOF || err == io.ErrUnexpectedEOF {
					return out, nil
				}
				if err != nil {
					return out, err
				}
				time.Sleep(100 * time.Millisecond)
			}
		}},
	} {
		t.Run(c.rep.Name, func(t *testing.T) {
			k := kvtest.Start(t, []*kvtest.Replica{c.rep}, func(cfg *config.Config) {
				cfg.Timeouts.ClientWrite = time.Second
			})
			start := time.Now()
			resp, err := httpPost(t, k.URL+"/v1/chat/completions", strings.NewReader(kvtest.ChatBody))
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.read(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatalf("after %v: %v", time.Since(start), err)
			}
			if c.want != nil && !bytes.Equal(got, c.want) {
				t.Errorf("got %d bytes, want %d", len(got), len(c.want))
			}
			if c.want == nil && strings.Count(string(got), "data: ") != events {
				t.Errorf("got %q, want %d events", got, events)
			}
			if n := k.Srv.Proxy.ClientWriteTimeouts(); n != 0 {
				t.Errorf("ClientWriteTimeouts() = %d, want 0", n)
			}
		})
	}
}

// An answer read whole (here, below a raised
// limits.max_buffered_response_bytes) whose client never reads it is
// dropped after timeouts.client_write: its in-flight place is freed and the
// cut counted; the replica, which had answered, is not charged.
func TestClientWriteTimeoutFreesBufferedAnswer(t *testing.T) {
	rep := kvtest.NewReplica(t, "a", bigAnswer(patterned(10<<20)))
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(cfg *config.Config) {
		cfg.Timeouts.ClientWrite = 500 * time.Millisecond
		cfg.Limits.MaxBufferedResponseBytes = 16 << 20
	})
	stalledClient(t, strings.TrimPrefix(k.URL, "http://"), "/v1/chat/completions", kvtest.ChatBody)
	kvtest.WaitFor(t, 10*time.Second, "the request to reach the replica", func() bool { return rep.Hits.Load() == 1 })
	kvtest.WaitFor(t, 10*time.Second, "the unread answer to be dropped", func() bool {
		return k.Srv.Proxy.InFlight() == 0 && k.Srv.Proxy.ClientWriteTimeouts() == 1
	})
	if r := k.Srv.Fleet.ByName("a"); r.InFlight() != 0 || r.ConsecutiveFailures() != 0 || !r.Healthy() {
		t.Errorf("replica: in flight %d, %d failures, healthy %v", r.InFlight(), r.ConsecutiveFailures(), r.Healthy())
	}
}
