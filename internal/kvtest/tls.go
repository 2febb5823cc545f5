package kvtest

import (
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testca"
)

// CA is a certificate authority made for one test (see testca).
type CA = testca.CA

// Leaf is a certificate a CA issued (see testca).
type Leaf = testca.Leaf

// NewCA makes a CA whose files live in a temporary directory of t.
func NewCA(t testing.TB) *CA { return testca.New(t) }

// UpstreamOptions say how a fake replica started by [NewUpstream] is
// reached.
type UpstreamOptions struct {
	// TLS, when set, makes the replica serve https with this server
	// configuration (HTTP/1.1).
	TLS *tls.Config
	// BasePath, when set ("/engine-a"), is the prefix under which the
	// replica serves every path; other paths get 404.
	BasePath string
}

// Upstream is a fake replica reached at a URL of its own: https, a base
// path, or both. It records every path asked of it, base path included.
type Upstream struct {
	*Replica
	url   string
	mu    sync.Mutex
	paths map[string]int
}

// NewUpstream starts a fake replica on 127.0.0.1 as [NewReplica] does,
// reached as o says. Use its URL (not its Replica's) in the configuration.
func NewUpstream(t testing.TB, name string, o UpstreamOptions, h http.HandlerFunc) *Upstream {
	t.Helper()
	ln := listen(t, "127.0.0.1:0")
	scheme := "http://"
	if o.TLS != nil {
		ln = tls.NewListener(ln, o.TLS)
		scheme = "https://"
	}
	f := &Replica{Name: name, ln: ln, addr: ln.Addr().String(), Models: []string{"m1"}, handler: h}
	f.Healthy.Store(true)
	u := &Upstream{Replica: f, url: scheme + f.addr + o.BasePath, paths: map[string]int{}}
	prefix := strings.TrimSuffix(o.BasePath, "/")
	f.srv = &http.Server{
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          quietLog(),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.mu.Lock()
			u.paths[r.URL.Path]++
			u.mu.Unlock()
			if prefix != "" {
				rest, ok := strings.CutPrefix(r.URL.Path, prefix)
				if !ok || rest != "" && rest[0] != '/' {
					http.NotFound(w, r)
					return
				}
				r.URL.Path = rest
				r.URL.RawPath = ""
			}
			f.serve(w, r)
		}),
	}
	go func() { _ = f.srv.Serve(ln) }()
	t.Cleanup(func() { _ = f.srv.Close() })
	return u
}

// quietLog discards the server's own logs (failed handshakes that tests
// provoke).
func quietLog() *log.Logger { return log.New(io.Discard, "", 0) }

// URL is the replica's URL: scheme, address and base path.
func (u *Upstream) URL() string { return u.url }

// PathHits returns how many requests asked for path (base path included).
func (u *Upstream) PathHits(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.paths[path]
}
