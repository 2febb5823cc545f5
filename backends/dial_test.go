package backends

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/internal/loopback"
)

// deadlineCounter counts the read deadlines set on a real connection.
type deadlineCounter struct {
	net.Conn
	set []time.Time
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.set = append(c.set, t)
	return c.Conn.SetReadDeadline(t)
}

func TestTimedConnDeadlines(t *testing.T) {
	client, server := loopback.Pair(t)
	tm := newReadTimeouts(10*time.Second, 5*time.Second)
	dc := &deadlineCounter{Conn: client}
	c := &timedConn{Conn: dc, t: tm}
	buf := make([]byte, 16)
	roundTrip := func(chunks int) {
		t.Helper()
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, make([]byte, 7)); err != nil {
			t.Fatal(err)
		}
		for range chunks {
			if _, err := server.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := []struct {
		name   string
		chunks int
		want   int // deadlines set so far
	}{
		// The first read waits for the first byte; the second switches to
		// the idle wait; the third keeps that deadline.
		{"three chunks", 3, 2},
		// The next request waits for its first byte again.
		{"next request", 1, 3},
		// A request right after, read in one piece, keeps that deadline.
		{"request after", 1, 3},
	}
	for _, st := range steps {
		roundTrip(st.chunks)
		if len(dc.set) != st.want {
			t.Fatalf("%s: %d deadlines set, want %d", st.name, len(dc.set), st.want)
		}
	}
	for i, dl := range dc.set {
		if left := time.Until(dl); left <= 0 || left > 10*time.Second {
			t.Fatalf("deadline %d is %v away", i, left)
		}
	}
	// Timeouts switched off clear the deadline once.
	tm.set(0, 0)
	roundTrip(2)
	if len(dc.set) != 4 || !dc.set[3].IsZero() {
		t.Fatalf("after switching timeouts off: deadlines %v", dc.set)
	}
}

// A replica that never answers times out no sooner than the first-byte
// wait less its slack.
func TestTimedConnFirstByteTimeout(t *testing.T) {
	client, server := loopback.Pair(t)
	const wait = 200 * time.Millisecond
	c := &timedConn{Conn: client, t: newReadTimeouts(wait, time.Hour)}
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 7)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.Read(make([]byte, 16))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of a silent replica: %v, want a deadline error", err)
	}
	if elapsed := time.Since(start); elapsed < wait-wait/DeadlineSlack {
		t.Fatalf("timed out after %v, before %v", elapsed, wait-wait/DeadlineSlack)
	}
}

// The fleet's read timeouts bound the proxy client's reads, first byte and
// stream idle, and change with SetTimeouts on a connection already open;
// the checks keep their own timeouts, and the head checks are the proxy
// client's too.
func TestProxyReadTimeouts(t *testing.T) {
	const wait = 150 * time.Millisecond
	h := startHostile(t, nil, func(c *hostileConn, r *http.Request) {
		switch r.URL.Path {
		case "/slow", pathHealth:
			time.Sleep(3 * wait)
			c.write(okAnswer)
		case "/pause":
			c.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk("a"))
			time.Sleep(3 * wait)
			c.write(chunk("b") + "0\r\n\r\n")
		case "/switch", pathMetrics:
			c.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n")
		}
	})
	f := newTestFleet(t, []Spec{{Name: "h", URL: h.url, Engine: EngineVLLM, Models: []string{"m1"}}},
		Options{FirstByteTimeout: wait, StreamIdleTimeout: wait, HealthTimeout: 10 * wait})
	r := f.ByName("h")
	get := func(path string) (string, error) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		r.SetRequestURI(req, []byte(path))
		resp.StreamBody = true
		if err := r.Client().Do(req, resp); err != nil {
			return "", err
		}
		defer func() { _ = resp.CloseBodyStream() }()
		bs := resp.BodyStream()
		if bs == nil {
			return string(resp.Body()), nil
		}
		b, err := io.ReadAll(bs)
		return string(b), err
	}
	// fasthttp reports a read deadline met before the head as its own
	// timeout.
	timedOut := func(err error) bool {
		return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout)
	}
	start := time.Now()
	if _, err := get("/slow"); !timedOut(err) {
		t.Fatalf("slow first byte: %v, want a deadline error", err)
	} else if el := time.Since(start); el < wait-wait/DeadlineSlack || el > 2*wait {
		t.Fatalf("slow first byte timed out after %v, want about %v", el, wait)
	}
	if _, err := get("/pause"); !timedOut(err) {
		t.Fatalf("paused stream: %v, want a deadline error", err)
	}
	if _, err := get("/switch"); !errors.Is(err, ErrBadResponseHead) {
		t.Fatalf("101 to the proxy client: %v, want ErrBadResponseHead", err)
	}
	// The checks: a slow health check passes, a 101 is only a status.
	if err := r.get(pathHealth, "", 10*wait, nil); err != nil {
		t.Fatalf("slow health check: %v", err)
	}
	var es *errStatus
	if err := r.get(pathMetrics, "", 10*wait, nil); !errors.As(err, &es) || es.code != 101 {
		t.Fatalf("101 to the check client: %v, want status 101", err)
	}
	conns := h.count()
	f.SetTimeouts(10*wait, 10*wait)
	if o := f.Options(); o.FirstByteTimeout != 10*wait || o.StreamIdleTimeout != 10*wait {
		t.Fatalf("Options after SetTimeouts: %v %v", o.FirstByteTimeout, o.StreamIdleTimeout)
	}
	for _, path := range []string{"/slow", "/pause"} {
		if body, err := get(path); err != nil {
			t.Fatalf("%s after SetTimeouts: %v", path, err)
		} else if path == "/pause" && body != "ab" {
			t.Fatalf("paused stream: %q", body)
		}
	}
	if n := h.count(); n != conns+1 {
		t.Fatalf("%d new connections for the two requests, want 1: SetTimeouts applies to an open one", n-conns)
	}
}
