package kvtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// CA is a certificate authority made for one test, its certificate written
// to File (PEM).
type CA struct {
	Cert *x509.Certificate
	File string
	key  *ecdsa.PrivateKey
	dir  string
	n    int64
}

// NewCA makes a CA whose files live in a temporary directory of t.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kvroute test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, dir: t.TempDir(), n: 1}
	ca.File = ca.write(t, "ca.pem", "CERTIFICATE", der)
	return ca
}

// Pool returns a pool holding the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Leaf is a certificate the CA issued, in memory and as PEM files.
type Leaf struct {
	TLS      tls.Certificate
	CertFile string
	KeyFile  string
}

// Server issues a server certificate for names: IP addresses and DNS names.
func (ca *CA) Server(t testing.TB, names ...string) Leaf {
	t.Helper()
	return ca.issue(t, x509.ExtKeyUsageServerAuth, names)
}

// Client issues a client certificate (for mutual TLS) named cn.
func (ca *CA) Client(t testing.TB, cn string) Leaf {
	t.Helper()
	return ca.issue(t, x509.ExtKeyUsageClientAuth, []string{cn})
}

func (ca *CA) issue(t testing.TB, usage x509.ExtKeyUsage, names []string) Leaf {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca.n++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.n),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	if usage == x509.ExtKeyUsageServerAuth {
		for _, n := range names {
			if ip := net.ParseIP(n); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			} else {
				tmpl.DNSNames = append(tmpl.DNSNames, n)
			}
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	base := strings.NewReplacer(".", "_", ":", "_").Replace(names[0])
	l := Leaf{
		CertFile: ca.write(t, base+"-"+big.NewInt(ca.n).String()+".pem", "CERTIFICATE", der),
		KeyFile:  ca.write(t, base+"-"+big.NewInt(ca.n).String()+"-key.pem", "PRIVATE KEY", keyDER),
	}
	l.TLS, err = tls.X509KeyPair(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (ca *CA) write(t testing.TB, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
