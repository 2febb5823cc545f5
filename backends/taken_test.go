package backends

import (
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/sockio"
)

// takeGet sends GET path through the proxy client and takes the answer's
// body; nil when it could not be taken.
func takeGet(t *testing.T, r *Replica, path string) (*fasthttp.Response, *Body) {
	t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	r.SetRequestURI(req, []byte(path))
	resp.StreamBody = true
	if err := r.Client().Do(req, resp); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return resp, TakeBody(resp)
}

// readTaken reads b to its end with Read, or with ReadNow when now is set
// (waiting between tries), and returns the data and the last error.
func readTaken(b *Body, now bool) (string, error) {
	var sb strings.Builder
	buf := make([]byte, 7) // small: chunks and framing split across reads
	deadline := time.Now().Add(5 * time.Second)
	for {
		var n int
		var err error
		if now {
			n, err = b.ReadNow(buf)
		} else {
			n, err = b.Read(buf)
		}
		sb.Write(buf[:n])
		switch {
		case errors.Is(err, sockio.ErrWouldBlock) && time.Now().Before(deadline):
			time.Sleep(time.Millisecond)
		case err != nil:
			return sb.String(), err
		}
	}
}

// TestTakeBody: a chunked answer taken from fasthttp reads as its chunks'
// data, however the replica splits its writes, and a body read to its end
// gives the connection back to the pool; one that did not end (closed
// early, malformed) does not.
func TestTakeBody(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	body := chunk("data: one\n\n") + chunk("data: two\n\n") + "0\r\n\r\n"
	cases := []struct {
		name   string
		writes []string
		want   string
		err    error // nil: io.EOF, a clean end
		reused bool
	}{
		{"one write", []string{head + body}, "data: one\n\ndata: two\n\n", nil, true},
		{"head alone first", []string{head, body}, "data: one\n\ndata: two\n\n", nil, true},
		{"split everywhere", []string{head[:10], head[10:] + body[:2], body[2:15], body[15:]}, "data: one\n\ndata: two\n\n", nil, true},
		{"interim head", []string{"HTTP/1.1 100 Continue\r\n\r\n" + head + body}, "data: one\n\ndata: two\n\n", nil, true},
		{"trailer", []string{head + chunk("abc") + "0\r\nX-T: 1\r\n\r\n"}, "abc", nil, true},
		{"extension", []string{head + "3;x=y\r\nabc\r\n0\r\n\r\n"}, "abc", nil, true},
		{"closed mid-body", []string{head + chunk("abc") + "5\r\nab"}, "abcab", io.ErrUnexpectedEOF, false},
		{"bad size", []string{head + chunk("abc") + "zz\r\n"}, "abc", ErrBadChunking, false},
	}
	for _, tc := range cases {
		for _, now := range []bool{false, true} {
			name := tc.name + "/read"
			if now {
				name = tc.name + "/readnow"
				if runtime.GOOS != "linux" {
					continue
				}
			}
			t.Run(name, func(t *testing.T) {
				h := startHostile(t, nil, func(c *hostileConn, _ *http.Request) {
					for _, w := range tc.writes {
						c.write(w)
						time.Sleep(2 * time.Millisecond)
					}
					if !tc.reused {
						_ = c.Close()
					}
				})
				r := testReplica(t, h.url)
				resp, b := takeGet(t, r, "/")
				if b == nil {
					t.Fatal("body not taken")
				}
				got, err := readTaken(b, now)
				if got != tc.want {
					t.Errorf("data %q, want %q", got, tc.want)
				}
				want := tc.err
				if want == nil {
					want = io.EOF
				}
				if !errors.Is(err, want) {
					t.Errorf("error %v, want %v", err, want)
				}
				finished := b.Finish(resp.BodyStream())
				if finished != tc.reused {
					t.Errorf("Finish %v, want %v", finished, tc.reused)
				}
				if !finished {
					resp.SetConnectionClose()
				}
				_ = resp.CloseBodyStream()
				fasthttp.ReleaseResponse(resp)
				if !tc.reused {
					return
				}
				// The next answer comes on the same connection, whole.
				if code, _, got := proxyGet(t, r, "/", "second"); code != 200 || got != "data: one\n\ndata: two\n\n" && got != tc.want {
					t.Fatalf("second answer: %d %q", code, got)
				}
				if n := h.count(); n != 1 {
					t.Fatalf("%d connections, want the first reused", n)
				}
			})
		}
	}
}

// TestTakeBodyOnlyFresh: a body is taken only when nothing of it was read
// through fasthttp, and only once; answers that are not chunked stay with
// fasthttp and read whole.
func TestTakeBodyOnlyFresh(t *testing.T) {
	h := startHostile(t, nil, func(c *hostileConn, r *http.Request) {
		if r.URL.Path == "/len" {
			c.write(okAnswer)
			return
		}
		c.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk("abc") + "0\r\n\r\n")
	})
	r := testReplica(t, h.url)
	resp, b := takeGet(t, r, "/len")
	if b != nil {
		t.Error("a Content-Length body was taken")
	}
	if got, err := io.ReadAll(resp.BodyStream()); err != nil || len(got) == 0 {
		t.Errorf("Content-Length body: %q, %v", got, err)
	}
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)

	resp, b = takeGet(t, r, "/chunked")
	if b == nil {
		t.Fatal("chunked body not taken")
	}
	if again := TakeBody(resp); again != nil {
		t.Error("a body was taken twice")
	}
	if got, err := readTaken(b, false); got != "abc" || !errors.Is(err, io.EOF) {
		t.Errorf("taken: %q, %v", got, err)
	}
	if !b.Finish(resp.BodyStream()) {
		t.Error("Finish after the end: false")
	}
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)

	// Not taken: fasthttp reads it as before, held bytes first.
	if code, _, got := proxyGet(t, r, "/chunked", "plain"); code != 200 || got != "abc" {
		t.Fatalf("untaken chunked answer: %d %q", code, got)
	}
	if n := h.count(); n != 1 {
		t.Fatalf("%d connections, want 1", n)
	}
}

// FuzzFollowBody: a replica's bytes after a head, split at random, read as
// a taken body does (framer.follow compacting the data). Whatever the
// bytes, following never panics, never returns more data than it was
// given, and splitting the same bytes differently gives the same data
// and the same end state. A well-formed chunked body built from the
// input gives back exactly its chunks' data.
func FuzzFollowBody(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), uint8(3))
	f.Add([]byte("3;x=y\r\nabc\r\n0\r\nX-T: 1\r\n\r\n"), uint8(1))
	f.Add([]byte("zz\r\n"), uint8(0))
	f.Add([]byte("ffffffffffffffff\r\n"), uint8(7))
	f.Add([]byte("data: {\"a\":1}\n\n"), uint8(5))
	f.Fuzz(func(t *testing.T, raw []byte, step uint8) {
		follow := func(b []byte, step int) ([]byte, int) {
			fr := framer{state: frChunkSize}
			var out []byte
			for len(b) > 0 {
				k := min(len(b), step)
				part := append([]byte(nil), b[:k]...)
				_, data, _ := fr.follow(part, true, false)
				if data > k {
					t.Fatalf("%d bytes of data from %d bytes", data, k)
				}
				out = append(out, part[:data]...)
				b = b[k:]
			}
			return out, fr.state
		}
		whole, state := follow(raw, len(raw)+1)
		split, splitState := follow(raw, int(step)+1)
		if string(whole) != string(split) || state != splitState {
			t.Fatalf("split every %d: %q (state %d), whole: %q (state %d)", step+1, split, splitState, whole, state)
		}
		// The input as the data of well-formed chunks.
		var body []byte
		for rest := raw; len(rest) > 0; {
			k := min(len(rest), int(step)%9+1)
			body = append(body, chunk(string(rest[:k]))...)
			rest = rest[k:]
		}
		body = append(body, "0\r\n\r\n"...)
		got, end := follow(body, int(step)+1)
		if string(got) != string(raw) || end != frIdle {
			t.Fatalf("chunked %q: data %q, state %d; want the input and the end", body, got, end)
		}
	})
}
