package backends

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Exchange reuses a connection after a whole answer, refuses a body past
// its limit (closing that connection), and, called off, closes the
// connection at once: the server sees its request end, and the error is
// the context's.
func TestExchange(t *testing.T) {
	var conns atomic.Int32
	ended := make(chan struct{}, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 2048)))
		case "/hang":
			select {
			case <-r.Context().Done():
				ended <- struct{}{}
			case <-time.After(10 * time.Second):
			}
		default:
			_, _ = w.Write([]byte("ok"))
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	r := testReplica(t, srv.URL)
	exchange := func(ctx context.Context, path string) (string, error) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		r.SetRequestURI(req, []byte(path))
		req.Header.SetMethod(http.MethodPost)
		err := r.Exchange(ctx, req, resp, 1024)
		return string(resp.Body()), err
	}
	for i := range 3 {
		if body, err := exchange(t.Context(), "/ok"); err != nil || body != "ok" {
			t.Fatalf("exchange %d: %q %v", i, body, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("3 exchanges took %d connections, want 1", n)
	}
	if _, err := exchange(t.Context(), "/big"); !errors.Is(err, fasthttp.ErrBodyTooLarge) {
		t.Fatalf("a body past the limit: %v, want ErrBodyTooLarge", err)
	}
	if body, err := exchange(t.Context(), "/ok"); err != nil || body != "ok" || conns.Load() != 2 {
		t.Fatalf("after a body past the limit: %q %v on %d connections, want a new one", body, err, conns.Load())
	}
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := exchange(ctx, "/hang"); !errors.Is(err, context.Canceled) {
		t.Fatalf("called off: %v, want context.Canceled", err)
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatalf("the server's request did not end (%v after the call)", time.Since(start))
	}
	if _, err := exchange(ctx, "/ok"); !errors.Is(err, context.Canceled) {
		t.Fatalf("on a done context: %v, want context.Canceled", err)
	}
	if r.ConsecutiveFailures() != 0 {
		t.Errorf("%d failures counted", r.ConsecutiveFailures())
	}
}
