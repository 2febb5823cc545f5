package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// bodyHead is the request line and headers of a chat request with the
// given framing header ("Content-Length: n" or "Transfer-Encoding: chunked").
func bodyHead(framing string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" +
		framing + "\r\n\r\n"
}

// chunk frames b as one chunk of a chunked body.
func chunk(b []byte) []byte {
	return append(append([]byte(fmt.Sprintf("%x\r\n", len(b))), b...), "\r\n"...)
}

// chatOfSize is a valid chat request of exactly n bytes (n >= 64).
func chatOfSize(n int) []byte {
	const head, tail = `{"model":"m1","messages":[{"role":"user","content":"`, `"}]}`
	b := make([]byte, 0, n)
	b = append(b, head...)
	for i := 0; len(b) < n-len(tail); i++ {
		b = append(b, byte('a'+i%26))
	}
	return append(b, tail...)
}

// exchange writes the pieces of a request to a new connection, pause
// between them, while reading the answer as it comes: kvroute may answer,
// and close, before the whole request is written. Write errors after the
// answer are expected and ignored. The body is read and closed before
// exchange returns.
//
//bodyclose:handled
func exchange(t *testing.T, addr string, pause time.Duration, pieces ...[]byte) (*http.Response, []byte) {
	t.Helper()
	conn := dialTCP(t, addr)
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	go func() {
		for i, p := range pieces {
			if i > 0 {
				time.Sleep(pause)
			}
			if _, err := conn.Write(p); err != nil {
				return
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no HTTP response: %v", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return resp, body
}

// Clients declaring large bodies and sending one byte of them cost kvroute
// what they sent, not what they declared: fasthttp no longer allocates the
// declared length up front.
func TestDeclaredBodyLengthIsNotAllocated(t *testing.T) {
	const conns, declared = 40, 8 << 20
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Limits.MaxBodyBytes = declared
		c.Timeouts.ClientHeader = 20 * time.Second
	})
	addr := strings.TrimPrefix(k.URL, "http://")

	var before, held runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	for i := 0; i < conns; i++ {
		c := dialTCP(t, addr)
		open = append(open, c)
		if _, err := io.WriteString(c, bodyHead(fmt.Sprintf("Content-Length: %d", declared))+"{"); err != nil {
			t.Fatal(err)
		}
	}
	// Time for kvroute to read every request's headers and its one byte.
	time.Sleep(time.Second)
	runtime.GC()
	runtime.ReadMemStats(&held)
	growth := int64(held.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d connections declaring %d MiB and sending 1 byte: heap alloc +%.1f MB, heap in use +%.1f MB",
		conns, declared>>20, float64(growth)/1e6, (float64(held.HeapInuse)-float64(before.HeapInuse))/1e6)
	if limit := int64(30 << 20); growth > limit {
		t.Errorf("heap grew by %d MB while %d clients held 1-byte bodies declared as %d MiB; want under %d MB",
			growth>>20, conns, declared>>20, limit>>20)
	}
	if n := k.Srv.Proxy.BodyBufferBytes(); n > int64(conns)*16<<10 {
		t.Errorf("BodyBufferBytes() = %d while %d clients sent 1 byte each", n, conns)
	}
	if rep.Hits.Load() != 0 {
		t.Errorf("%d incomplete requests reached the replica", rep.Hits.Load())
	}
}

// A body sent too slowly ends with 408 once timeouts.client_header has
// passed, whether kvroute is still reading its first bytes or the rest,
// and holds nothing afterwards.
func TestSlowBodyTimesOut(t *testing.T) {
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Timeouts.ClientHeader = 500 * time.Millisecond
	})
	addr := strings.TrimPrefix(k.URL, "http://")
	part := chatOfSize(100000)[:20000]
	for _, c := range []struct {
		name   string
		pieces [][]byte
	}{
		{"one byte of a declared body", [][]byte{[]byte(bodyHead("Content-Length: 100000") + "{")}},
		{"part of a declared body", [][]byte{[]byte(bodyHead("Content-Length: 100000")), part}},
		{"part of a chunked body", [][]byte{[]byte(bodyHead("Transfer-Encoding: chunked")), chunk(part)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, body := exchange(t, addr, 10*time.Millisecond, c.pieces...)
			if resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("status %d, want 408: %.200s", resp.StatusCode, body)
			}
			assertOpenAIError(t, body, "request_timeout")
			kvtest.WaitFor(t, 5*time.Second, "the request to settle", func() bool {
				return k.Srv.Proxy.InFlight() == 0 && k.Srv.Proxy.BodyBufferBytes() == 0
			})
		})
	}
	if rep.Hits.Load() != 0 {
		t.Errorf("%d incomplete requests reached the replica", rep.Hits.Load())
	}
}

// A body over limits.max_body_bytes gets 413 with nothing of it read when
// its Content-Length says so, and as soon as the limit is crossed when it
// is chunked; a chunked body of exactly the limit is forwarded.
func TestBodyOverLimit(t *testing.T) {
	const limit = 64 << 10
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Limits.MaxBodyBytes = limit
		c.Timeouts.ClientHeader = 3 * time.Second
	})
	addr := strings.TrimPrefix(k.URL, "http://")
	var chunks [][]byte
	chunks = append(chunks, []byte(bodyHead("Transfer-Encoding: chunked")))
	over := chatOfSize(limit + 1)
	for i := 0; i < len(over); i += 16 << 10 {
		chunks = append(chunks, chunk(over[i:min(i+16<<10, len(over))]))
	}
	// Never terminated: the answer must come from crossing the limit.

	for _, c := range []struct {
		name   string
		pieces [][]byte
		within time.Duration // the answer comes before the client_header timeout would
	}{
		// Nothing of the body is sent: the answer cannot wait for it.
		{"declared, HTTP/1.1", [][]byte{[]byte(bodyHead(fmt.Sprintf("Content-Length: %d", limit+1)))}, 2 * time.Second},
		{"declared, HTTP/1.0", [][]byte{[]byte(strings.Replace(bodyHead(fmt.Sprintf("Content-Length: %d", limit+1)), "HTTP/1.1", "HTTP/1.0", 1)), over[:9000]}, 2 * time.Second},
		{"chunked", chunks, 2 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			resp, body := exchange(t, addr, 20*time.Millisecond, c.pieces...)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d after %v, want 413: %.200s", resp.StatusCode, time.Since(start), body)
			}
			assertOpenAIError(t, body, "body_too_large")
			if !resp.Close {
				t.Errorf("413 keeps the connection open, with the body unread")
			}
			if d := time.Since(start); d > c.within {
				t.Errorf("413 came after %v: it waited for the client_header timeout", d)
			}
			kvtest.WaitFor(t, 5*time.Second, "the request to settle", func() bool {
				return k.Srv.Proxy.InFlight() == 0 && k.Srv.Proxy.BodyBufferBytes() == 0
			})
		})
	}
	if rep.Hits.Load() != 0 {
		t.Fatalf("%d bodies over the limit reached the replica", rep.Hits.Load())
	}

	exact := chatOfSize(limit)
	pieces := [][]byte{[]byte(bodyHead("Transfer-Encoding: chunked"))}
	for i := 0; i < len(exact); i += 10000 {
		pieces = append(pieces, chunk(exact[i:min(i+10000, len(exact))]))
	}
	pieces = append(pieces, []byte("0\r\n\r\n"))
	resp, body := exchange(t, addr, time.Millisecond, pieces...)
	if resp.StatusCode != 200 {
		t.Fatalf("chunked body of exactly limits.max_body_bytes: status %d: %.200s", resp.StatusCode, body)
	}
	if _, got := rep.LastRequest(); !bytes.Equal(got, exact) {
		t.Errorf("replica got %d bytes, want the %d sent", len(got), len(exact))
	}
}

// Requests of every size and framing are forwarded byte for byte, also on a
// kept-alive connection and after Expect: 100-continue, and hold no body
// buffer once answered.
func TestBodiesForwardedByteExact(t *testing.T) {
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Limits.MaxBodyBytes = 8 << 20
	})
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
	for _, size := range []int{64, 8 << 10, 8<<10 + 1, 100000, 4 << 20, 4<<20 + 12345} {
		for _, framing := range []string{"length", "chunked", "expect"} {
			t.Run(fmt.Sprintf("%d/%s", size, framing), func(t *testing.T) {
				want := chatOfSize(size)
				newReq := func() *http.Request {
					var r io.Reader = bytes.NewReader(want)
					if framing == "chunked" {
						r = io.MultiReader(r) // no length known: sent chunked
					}
					req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions", r)
					if err != nil {
						t.Fatal(err)
					}
					req.Header.Set("Content-Type", "application/json")
					if framing == "expect" {
						req.Header.Set("Expect", "100-continue")
					}
					return req
				}
				for i := 0; i < 2; i++ { // the second on the kept-alive connection
					resp, err := client.Do(newReq())
					if err != nil {
						t.Fatal(err)
					}
					answer, _ := io.ReadAll(resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Fatalf("status %d: %.200s", resp.StatusCode, answer)
					}
					if _, got := rep.LastRequest(); !bytes.Equal(got, want) {
						t.Fatalf("replica got %d bytes, want the %d sent, byte for byte", len(got), len(want))
					}
				}
				kvtest.WaitFor(t, 5*time.Second, "the body buffers to be handed back", func() bool {
					return k.Srv.Proxy.BodyBufferBytes() == 0
				})
			})
		}
	}
}

// With limits.max_body_buffer_bytes small, clients sending large bodies
// slowly at once share it: the bodies that would pass it get 503
// body_budget_exhausted with Retry-After, the others are forwarded, the
// budget is never passed and is all handed back afterwards.
func TestBodyBufferBudget(t *testing.T) {
	const clients, size, budget = 4, 512 << 10, 1 << 20
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Limits.MaxBodyBytes = size
		c.Limits.MaxBodyBufferBytes = budget
	})
	addr := strings.TrimPrefix(k.URL, "http://")
	body := chatOfSize(size)
	pieces := [][]byte{[]byte(bodyHead(fmt.Sprintf("Content-Length: %d", size)))}
	for i := 0; i < size; i += 32 << 10 {
		pieces = append(pieces, body[i:min(i+32<<10, size)])
	}

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := k.Srv.Proxy.BodyBufferBytes(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, answer := exchange(t, addr, 20*time.Millisecond, pieces...)
			switch resp.StatusCode {
			case 200:
			case http.StatusServiceUnavailable:
				assertOpenAIError(t, answer, "body_budget_exhausted")
				if resp.Header.Get("Retry-After") == "" {
					t.Errorf("503 without Retry-After")
				}
			default:
				t.Errorf("status %d: %.200s", resp.StatusCode, answer)
			}
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	kvtest.WaitFor(t, 5*time.Second, "the budget to be handed back", func() bool {
		return k.Srv.Proxy.BodyBufferBytes() == 0 && k.Srv.Proxy.InFlight() == 0
	})
	close(stop)
	<-sampled
	t.Logf("answers %v, peak body buffers %d KiB of %d KiB", statuses, peak.Load()>>10, budget>>10)
	if statuses[200] == 0 || statuses[http.StatusServiceUnavailable] == 0 {
		t.Errorf("answers %v: want some bodies forwarded and some refused", statuses)
	}
	if p := peak.Load(); p > budget {
		t.Errorf("body buffers peaked at %d bytes, over limits.max_body_buffer_bytes %d", p, budget)
	}
	if got := int(rep.Hits.Load()); got != statuses[200] {
		t.Errorf("replica got %d requests, %d were answered 200", got, statuses[200])
	}
	if _, got := rep.LastRequest(); !bytes.Equal(got, body) {
		t.Errorf("replica got %d bytes, want the %d sent", len(got), len(body))
	}

	// Alone, a body of max_body_bytes fits the least budget config allows.
	resp, answer := exchange(t, addr, time.Millisecond, pieces...)
	if resp.StatusCode != 200 {
		t.Errorf("a lone body after the others: status %d: %.200s", resp.StatusCode, answer)
	}
}

// config.MinBodyBufferBytes is what one body of limits.max_body_bytes
// holds while read: config accepts that budget, which reads such a body,
// and refuses one byte less.
func TestMinBodyBufferBytes(t *testing.T) {
	const limit = 100000 // not a power of two
	need := config.MinBodyBufferBytes(limit)
	cfg := kvtest.Config(nil)
	cfg.Limits.MaxBodyBytes, cfg.Limits.MaxBodyBufferBytes = limit, int(need)-1
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "limits.max_body_buffer_bytes") {
		t.Errorf("budget %d for bodies of %d: Validate() = %v, want an error naming limits.max_body_buffer_bytes", need-1, limit, err)
	}
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(c *config.Config) {
		c.Limits.MaxBodyBytes, c.Limits.MaxBodyBufferBytes = limit, int(need)
	})
	body := chatOfSize(limit)
	for _, framing := range []string{fmt.Sprintf("Content-Length: %d", limit), "Transfer-Encoding: chunked"} {
		pieces := [][]byte{[]byte(bodyHead(framing))}
		for i := 0; i < limit; i += 7000 {
			p := body[i:min(i+7000, limit)]
			if framing[0] == 'T' {
				p = chunk(p)
			}
			pieces = append(pieces, p)
		}
		if framing[0] == 'T' {
			pieces = append(pieces, []byte("0\r\n\r\n"))
		}
		resp, answer := exchange(t, strings.TrimPrefix(k.URL, "http://"), time.Millisecond, pieces...)
		if resp.StatusCode != 200 {
			t.Errorf("%s, budget %d: status %d: %.200s", framing, need, resp.StatusCode, answer)
		}
	}
}
