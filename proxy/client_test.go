package proxy_test

import (
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// The clients the tests use: connections, listeners and requests that
// take the test's context, so that none outlives the test that made it.

// postJSON is kvtest.Post: a JSON POST whose answer's body it reads and
// closes before it returns.
//
//bodyclose:handled
func postJSON(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	return kvtest.Post(t, url, body, hdr)
}

// httpGet is http.Get with the test's context.
func httpGet(t testing.TB, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return http.DefaultClient.Do(req)
}

// httpPost is http.Post of a JSON body with the test's context.
func httpPost(t testing.TB, url string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return http.DefaultClient.Do(req)
}

// dialTCP opens a TCP connection to addr, or fails the test.
func dialTCP(t testing.TB, addr string) net.Conn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// listenTCP listens on a free port of 127.0.0.1 (network "tcp" or
// "tcp4"), or fails the test.
func listenTCP(t testing.TB, network string) net.Listener {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), network, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
