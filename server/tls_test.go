package server_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/server"
)

// testCA signs listener certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvroute test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// leaf returns a PEM certificate for 127.0.0.1 with the given serial, and
// its PEM key.
func (ca *testCA) leaf(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "kvroute"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// secretDir lays certificate files out the way a Kubernetes Secret volume
// (and so cert-manager) does: dir/tls.crt -> ..data/tls.crt, ..data -> a
// timestamped directory; a rotation writes a new directory and swaps the
// ..data symlink with a rename. A plain secretDir holds regular files that
// a rotation rewrites in place, one after the other.
type secretDir struct {
	t     *testing.T
	dir   string
	gen   int
	plain bool
}

func newSecretDir(t *testing.T, certPEM, keyPEM []byte) *secretDir {
	d := &secretDir{t: t, dir: t.TempDir()}
	d.publish(certPEM, keyPEM)
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(d.dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func newPlainDir(t *testing.T, certPEM, keyPEM []byte) *secretDir {
	d := &secretDir{t: t, dir: t.TempDir(), plain: true}
	d.publish(certPEM, keyPEM)
	return d
}

func (d *secretDir) publish(certPEM, keyPEM []byte) {
	d.t.Helper()
	if d.plain {
		if err := os.WriteFile(filepath.Join(d.dir, "tls.crt"), certPEM, 0o600); err != nil {
			d.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.dir, "tls.key"), keyPEM, 0o600); err != nil {
			d.t.Fatal(err)
		}
		return
	}
	d.gen++
	ts := filepath.Join(d.dir, "..gen"+strings.Repeat("x", d.gen))
	if err := os.Mkdir(ts, 0o700); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "tls.crt"), certPEM, 0o600); err != nil {
		d.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "tls.key"), keyPEM, 0o600); err != nil {
		d.t.Fatal(err)
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		d.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		d.t.Fatal(err)
	}
}

func (d *secretDir) tls(minVersion string) config.ListenerTLS {
	return config.ListenerTLS{CertFile: filepath.Join(d.dir, "tls.crt"), KeyFile: filepath.Join(d.dir, "tls.key"), MinVersion: minVersion}
}

func httpsURL(u string) string { return "https://" + strings.TrimPrefix(u, "http://") }

// serial gets url over a new connection of client and returns the serial
// of the server's certificate, or -1 when the request failed.
func serial(t *testing.T, client *http.Client, url string) (int64, bool) {
	t.Helper()
	var reused bool
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(ci httptrace.GotConnInfo) { reused = ci.Reused },
	}))
	resp, err := client.Do(req)
	if err != nil {
		t.Logf("GET %s: %v", url, err)
		return -1, false
	}
	defer func() { _ = resp.Body.Close() }()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("GET %s: status %d, TLS %v", url, resp.StatusCode, resp.TLS != nil)
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.Int64(), reused
}

func tlsClient(pool *x509.CertPool, keepAlive bool) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: !keepAlive,
	}}
}

// The proxy and admin listeners serve TLS; a rotated certificate reaches new
// connections while a kept-alive one keeps working; a rotation to a broken
// pair keeps the previous certificate and logs. Both the Secret-volume
// layout (a symlink swap) and files rewritten in place are followed.
func TestListenerTLSRotates(t *testing.T) {
	for _, layout := range []struct {
		name string
		make func(*testing.T, []byte, []byte) *secretDir
	}{{"symlink swap", newSecretDir}, {"rewritten in place", newPlainDir}} {
		t.Run(layout.name, func(t *testing.T) { testListenerTLSRotates(t, layout.make) })
	}
}

func testListenerTLSRotates(t *testing.T, newDir func(*testing.T, []byte, []byte) *secretDir) {
	ca := newTestCA(t)
	c1, k1 := ca.leaf(t, 101)
	proxyDir := newDir(t, c1, k1)
	ac, ak := ca.leaf(t, 201)
	adminDir := newSecretDir(t, ac, ak)
	core, logs := observer.New(zapcore.InfoLevel)
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{rep}, func(c *config.Config) {
		c.TLS = proxyDir.tls("1.2")
		c.AdminTLS = adminDir.tls("1.2")
	})
	url := httpsURL(k.URL) + "/v1/models"

	kept := tlsClient(ca.pool, true)
	if got, _ := serial(t, kept, url); got != 101 {
		t.Fatalf("first certificate: serial %d, want 101", got)
	}
	if got, _ := serial(t, tlsClient(ca.pool, false), httpsURL(k.Admin)+"/healthz"); got != 201 {
		t.Fatalf("admin certificate: serial %d, want 201", got)
	}
	// Plain HTTP on the TLS listener gets no answer.
	if resp, err := httpGet(t, http.DefaultClient, k.URL+"/v1/models"); err == nil {
		_ = resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP served on the TLS listener")
		}
	}

	c2, k2 := ca.leaf(t, 102)
	proxyDir.publish(c2, k2)
	fresh := tlsClient(ca.pool, false)
	kvtest.WaitFor(t, 5*time.Second, "new connections to get the rotated certificate", func() bool {
		got, _ := serial(t, fresh, url)
		return got == 102
	})
	got, reused := serial(t, kept, url)
	if !reused || got != 101 {
		t.Fatalf("kept-alive connection after rotation: reused %v, serial %d; want the same connection (serial 101)", reused, got)
	}

	// A broken pair (a key that is not the certificate's) is not taken.
	_, k3 := ca.leaf(t, 103)
	c3, _ := ca.leaf(t, 103)
	failed := logs.FilterMessageSnippet("certificate reload failed").Len()
	proxyDir.publish(c3, k3)
	kvtest.WaitFor(t, 5*time.Second, "the failed reload to be logged", func() bool {
		return logs.FilterMessageSnippet("certificate reload failed").Len() > failed
	})
	if got, _ := serial(t, fresh, url); got != 102 {
		t.Fatalf("after a failed reload: serial %d, want the previous 102", got)
	}
	e := logs.FilterMessageSnippet("certificate reload failed").All()[0]
	if msg, _ := e.ContextMap()["error"].(string); !strings.Contains(msg, proxyDir.tls("").CertFile) {
		t.Errorf("reload error does not name the file: %q", msg)
	}
}

// min_version 1.3 refuses a client that speaks at most TLS 1.2.
func TestListenerTLSMinVersion(t *testing.T) {
	ca := newTestCA(t)
	c, key := ca.leaf(t, 7)
	dir := newSecretDir(t, c, key)
	rep := kvtest.NewReplica(t, "a", nil)
	k := kvtest.Start(t, []*kvtest.Replica{rep}, func(cfg *config.Config) { cfg.TLS = dir.tls("1.3") })
	addr := strings.TrimPrefix(k.URL, "http://")
	tests := []struct {
		name   string
		max    uint16
		wantOK bool
	}{
		{"tls1.2-only client", tls.VersionTLS12, false},
		{"tls1.3 client", tls.VersionTLS13, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second},
				Config: &tls.Config{RootCAs: ca.pool, MaxVersion: tt.max}}
			conn, err := d.DialContext(t.Context(), "tcp", addr)
			if err == nil {
				defer func() { _ = conn.Close() }()
			}
			if ok := err == nil; ok != tt.wantOK {
				t.Fatalf("handshake error %v, want success %v", err, tt.wantOK)
			}
			if err != nil && !strings.Contains(err.Error(), "protocol version") {
				t.Errorf("handshake failed for another reason: %v", err)
			}
		})
	}
}

// CheckTLS (run by validate and serve) names the file that does not load.
func TestCheckTLSNamesTheFile(t *testing.T) {
	ca := newTestCA(t)
	c, key := ca.leaf(t, 9)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certFile, keyFile := write("tls.crt", c), write("tls.key", key)
	junk := write("junk.pem", []byte("not a certificate"))
	missing := filepath.Join(dir, "missing.crt")
	tests := []struct {
		name  string
		tls   config.ListenerTLS
		admin config.ListenerTLS
		want  []string // in the error; none: no error
	}{
		{"good", config.ListenerTLS{CertFile: certFile, KeyFile: keyFile}, config.ListenerTLS{}, nil},
		{"missing cert", config.ListenerTLS{CertFile: missing, KeyFile: keyFile}, config.ListenerTLS{}, []string{"tls.cert_file", missing}},
		{"junk cert", config.ListenerTLS{CertFile: junk, KeyFile: keyFile}, config.ListenerTLS{}, []string{"tls:", junk}},
		{"admin missing key", config.ListenerTLS{}, config.ListenerTLS{CertFile: certFile, KeyFile: missing}, []string{"admin_tls.key_file", missing}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.TLS, cfg.AdminTLS = tt.tls, tt.admin
			err := server.CheckTLS(cfg)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}
