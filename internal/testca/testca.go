// Package testca makes certificate authorities and the certificates they
// issue, as PEM files in a test's temporary directory, for tests of TLS
// listeners and upstreams. It depends only on the standard library, so the
// tests of any package can use it.
package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
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

// New makes a CA whose files live in a temporary directory of t.
func New(t testing.TB) *CA {
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
	return ca.issue(t, names, x509.ExtKeyUsageServerAuth)
}

// Client issues a client certificate (for mutual TLS) named cn.
func (ca *CA) Client(t testing.TB, cn string) Leaf {
	t.Helper()
	return ca.issue(t, []string{cn}, x509.ExtKeyUsageClientAuth)
}

// Peer issues a certificate for names good for both ends of a connection
// (a cluster route, where each instance dials and accepts).
func (ca *CA) Peer(t testing.TB, names ...string) Leaf {
	t.Helper()
	return ca.issue(t, names, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(t testing.TB, names []string, usages ...x509.ExtKeyUsage) Leaf {
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
		ExtKeyUsage:  usages,
	}
	if usages[0] == x509.ExtKeyUsageServerAuth {
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
