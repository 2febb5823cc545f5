package runner

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// startNamed serves an HTTP server on 127.0.0.1:0 that answers every
// request with name; it returns its host:port and a function that closes
// it (listener and connections).
func startNamed(t *testing.T, name string) (addr string, stop func()) {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, name)
	})}
	go func() { _ = srv.Serve(ln) }()
	stop = func() { _ = srv.Close() }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// get sends GET / through client and returns the body.
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The front hands each new connection to the next server in turn, keeps a
// connection's requests on its server, and skips a server that stopped.
func TestFrontSpreadsConnectionsAndSkipsDeadTarget(t *testing.T) {
	names := []string{"a", "b", "c"}
	var addrs []string
	stops := map[string]func(){}
	for _, n := range names {
		addr, stop := startNamed(t, n)
		addrs = append(addrs, addr)
		stops[n] = stop
	}
	f, err := startFront(t.Context(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	url := "http://" + f.Addr() + "/"
	noKeepAlive := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

	var got []string
	for range 6 {
		got = append(got, get(t, noKeepAlive, url))
	}
	if s := strings.Join(got, ""); s != "abcabc" {
		t.Fatalf("new connections went to %q, want abcabc", s)
	}

	// One kept-alive connection: every request on it reaches one server.
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}
	keepAlive := &http.Client{Transport: tr}
	first := get(t, keepAlive, url)
	for range 4 {
		if s := get(t, keepAlive, url); s != first {
			t.Fatalf("a kept-alive connection's requests went to %s and %s", first, s)
		}
	}
	tr.CloseIdleConnections()

	stops["b"]()
	got = got[:0]
	for range 6 {
		got = append(got, get(t, noKeepAlive, url))
	}
	if s := strings.Join(got, ""); strings.Contains(s, "b") || strings.Count(s, "a") != 3 || strings.Count(s, "c") != 3 {
		t.Fatalf("after b stopped, new connections went to %q, want a and c in turn", s)
	}
	if h := f.Handed(); h[1] != 2 {
		t.Fatalf("b was handed %d connections, want 2 (before it stopped): %v", h[1], h)
	}
}

// cut resets the connections relayed to one target: a request waiting on
// it fails at once, and the front keeps serving through the others.
func TestFrontCutResetsConnections(t *testing.T) {
	release := make(chan struct{})
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	slow := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		<-release
		_, _ = io.WriteString(w, "slow")
	})}
	go func() { _ = slow.Serve(ln) }()
	defer func() { close(release); _ = slow.Close() }()
	other, _ := startNamed(t, "other")

	f, err := startFront(t.Context(), []string{ln.Addr().String(), other})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	errc := make(chan error, 1)
	go func() {
		resp, err := client.Get("http://" + f.Addr() + "/")
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	kvtest.WaitFor(t, 5*time.Second, "the first connection to reach the first target", func() bool { return f.Handed()[0] == 1 })
	f.cut(0)
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a request on a cut connection succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request on a cut connection still waits")
	}
	if s := get(t, client, "http://"+f.Addr()+"/"); s != "other" {
		t.Fatalf("next connection went to %q, want other", s)
	}
}
