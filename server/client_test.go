package server_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// The clients the tests use: listeners, dials and requests that take the
// test's context, so that none outlives the test that made it.

// listenLocal listens on a free 127.0.0.1 port with the test's context.
func listenLocal(t testing.TB) (net.Listener, error) {
	var lc net.ListenConfig
	return lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
}

// dialTCP is net.DialTimeout("tcp", addr, timeout) with the test's context.
func dialTCP(t testing.TB, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.DialContext(t.Context(), "tcp", addr)
}

// httpGet is c.Get(url) with the test's context.
func httpGet(t testing.TB, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// httpPost is c.Post(url, "application/json", body) with the test's context.
func httpPost(t testing.TB, c *http.Client, url string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return c.Do(req)
}

// postJSON is kvtest.Post without headers: a JSON POST whose answer's body it reads and
// closes before it returns.
//
//bodyclose:handled
func postJSON(t testing.TB, url, body string) (*http.Response, []byte) {
	t.Helper()
	return kvtest.Post(t, url, body, nil)
}
