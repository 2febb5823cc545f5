package backends

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// TLS is the client side of the TLS connections to one https replica. Its
// files are PEM and are read when the spec is validated ([ValidateSpecs],
// [NewFleet], [Fleet.Update]); a file that cannot be read or holds nothing
// usable is an error naming it. The zero value uses [Options.TLSConfig]
// (default: the system roots, no client certificate, the URL's host as
// server name). Proxied requests, health, models and metrics checks all use
// the same configuration. A spec of an http URL may carry TLS settings; its
// files are checked all the same and otherwise unused.
type TLS struct {
	// CAFile is a bundle of the CAs that sign the replica's certificate;
	// they replace the system roots (or Options.TLSConfig's RootCAs).
	CAFile string
	// CertFile and KeyFile are the client certificate chain and its private
	// key, presented to the replica (mutual TLS). Both or neither.
	CertFile string
	KeyFile  string
	// ServerName is sent as SNI and verified in the replica's certificate.
	// Empty: Options.TLSConfig's ServerName if it has one, else the URL's
	// host.
	ServerName string
	// InsecureSkipVerify turns verification of the replica's certificate
	// off.
	InsecureSkipVerify bool
}

// tlsFiles is what a TLS spec's files hold, read at validation.
type tlsFiles struct {
	roots *x509.CertPool   // nil: not configured
	cert  *tls.Certificate // nil: no client certificate
	pem   [3][]byte        // the CA, cert and key files as read, to tell a change
}

// same reports whether f and o were read from files of the same contents.
func (f tlsFiles) same(o tlsFiles) bool {
	for i := range f.pem {
		if !bytes.Equal(f.pem[i], o.pem[i]) {
			return false
		}
	}
	return true
}

// load reads the files t names.
func (t TLS) load() (tlsFiles, error) {
	var out tlsFiles
	if t.CAFile != "" {
		pem, err := readFile(t.CAFile)
		if err != nil {
			return out, fmt.Errorf("TLS CA file %q: %w", t.CAFile, err)
		}
		out.pem[0] = pem
		out.roots = x509.NewCertPool()
		if !out.roots.AppendCertsFromPEM(pem) {
			return out, fmt.Errorf("TLS CA file %q: no PEM certificate in it", t.CAFile)
		}
	}
	switch {
	case t.CertFile == "" && t.KeyFile == "":
	case t.CertFile == "" || t.KeyFile == "":
		return out, fmt.Errorf("TLS client certificate needs both a cert file and a key file (got cert %q, key %q)", t.CertFile, t.KeyFile)
	default:
		certPEM, err := readFile(t.CertFile)
		if err != nil {
			return out, fmt.Errorf("TLS cert file %q: %w", t.CertFile, err)
		}
		keyPEM, err := readFile(t.KeyFile)
		if err != nil {
			return out, fmt.Errorf("TLS key file %q: %w", t.KeyFile, err)
		}
		out.pem[1], out.pem[2] = certPEM, keyPEM
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return out, fmt.Errorf("TLS cert file %q with key file %q: %w", t.CertFile, t.KeyFile, err)
		}
		out.cert = &cert
	}
	return out, nil
}

// readFile reads a file; its error leaves out the path, which the caller
// names.
func readFile(name string) ([]byte, error) {
	b, err := os.ReadFile(name)
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return nil, pe.Err
	}
	return b, err
}

// tlsConfig builds the client configuration of an https replica from the
// base Options.TLSConfig and the replica's own TLS settings; nil for http.
// Every configuration asks for TLS 1.2 or later and has a session cache of
// its own, shared by the replica's proxy and check clients.
func tlsConfig(t target, o *Options) *tls.Config {
	if !t.tls {
		return nil
	}
	var cfg *tls.Config
	if o.TLSConfig != nil {
		cfg = o.TLSConfig.Clone()
	} else {
		cfg = &tls.Config{}
	}
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	s := t.tlsSpec
	if t.tlsFiles.roots != nil {
		cfg.RootCAs = t.tlsFiles.roots
	}
	if t.tlsFiles.cert != nil {
		cfg.Certificates = []tls.Certificate{*t.tlsFiles.cert}
	}
	if s.ServerName != "" {
		cfg.ServerName = s.ServerName
	}
	if cfg.ServerName == "" {
		cfg.ServerName = t.host
	}
	if s.InsecureSkipVerify {
		cfg.InsecureSkipVerify = true
	}
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	return cfg
}

// replicaTLS is the TLS configuration a replica's new connections use.
type replicaTLS struct {
	spec  TLS
	files tlsFiles
	cfg   *tls.Config // nil for http
}

// setTLS makes the TLS settings and files of t the configuration of the
// replica's new connections, and reports whether they replace different
// ones (other settings, or files whose contents changed since they were
// last read). Unchanged, the configuration in use is kept, with its session
// cache; a new one starts a new cache, so no session made with an old
// client certificate is resumed.
func (r *Replica) setTLS(t target) (changed bool) {
	old := r.tls.Load()
	if old != nil && old.spec == t.tlsSpec && old.files.same(t.tlsFiles) {
		return false
	}
	r.tls.Store(&replicaTLS{spec: t.tlsSpec, files: t.tlsFiles, cfg: tlsConfig(t, r.opts)})
	return old != nil
}

// tlsConfig returns the TLS configuration of the replica's new
// connections; nil for http. Shared: do not modify.
func (r *Replica) tlsConfig() *tls.Config { return r.tls.Load().cfg }
