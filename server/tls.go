package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
)

// certPoll is how often a listener's certificate files are read again even
// when no file event came (file systems that do not report changes).
const certPoll = time.Minute

// certDebounce lets a rotation that writes several files settle before they
// are read.
const certDebounce = 100 * time.Millisecond

// certSource holds a listener's certificate and reads its files again when
// they change: cert-manager and Kubernetes Secret volumes replace them by
// swapping a symlink in their directory, which is watched. Handshakes get
// the current certificate through GetCertificate; connections already open
// keep the one they were made with. A pair that fails to load keeps the
// previous certificate serving and is logged once.
type certSource struct {
	field             string // the configuration key, "tls" or "admin_tls"
	certFile, keyFile string
	log               *zap.Logger
	cur               atomic.Pointer[tls.Certificate]

	mu         sync.Mutex // serializes reload
	cert, key  []byte     // the files' contents behind cur
	badC, badK []byte     // the contents of the last pair that failed
}

// readPair reads and parses a certificate chain and key, naming the file
// and the key that set it in errors.
func readPair(field string, t config.ListenerTLS) (certPEM, keyPEM []byte, pair *tls.Certificate, err error) {
	if certPEM, err = os.ReadFile(t.CertFile); err != nil {
		return nil, nil, nil, fmt.Errorf("%s.cert_file: %w", field, err)
	}
	if keyPEM, err = os.ReadFile(t.KeyFile); err != nil {
		return nil, nil, nil, fmt.Errorf("%s.key_file: %w", field, err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: cert_file %s with key_file %s: %w", field, t.CertFile, t.KeyFile, err)
	}
	return certPEM, keyPEM, &c, nil
}

func newCertSource(field string, t config.ListenerTLS, log *zap.Logger) (*certSource, error) {
	certPEM, keyPEM, pair, err := readPair(field, t)
	if err != nil {
		return nil, err
	}
	c := &certSource{field: field, certFile: t.CertFile, keyFile: t.KeyFile, log: log, cert: certPEM, key: keyPEM}
	c.cur.Store(pair)
	return c, nil
}

func (c *certSource) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// reload reads the files again and swaps the certificate if they changed.
func (c *certSource) reload() {
	c.mu.Lock()
	defer c.mu.Unlock()
	certPEM, err := os.ReadFile(c.certFile)
	if err != nil {
		c.failed(nil, nil, fmt.Errorf("%s.cert_file: %w", c.field, err))
		return
	}
	keyPEM, err := os.ReadFile(c.keyFile)
	if err != nil {
		c.failed(nil, nil, fmt.Errorf("%s.key_file: %w", c.field, err))
		return
	}
	if bytes.Equal(certPEM, c.cert) && bytes.Equal(keyPEM, c.key) {
		return
	}
	if bytes.Equal(certPEM, c.badC) && bytes.Equal(keyPEM, c.badK) {
		return // logged already
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		c.failed(certPEM, keyPEM, fmt.Errorf("%s: cert_file %s with key_file %s: %w", c.field, c.certFile, c.keyFile, err))
		return
	}
	c.cert, c.key, c.badC, c.badK = certPEM, keyPEM, nil, nil
	c.cur.Store(&pair)
	fields := []zap.Field{zap.String("listener", c.field), zap.String("cert_file", c.certFile)}
	if pair.Leaf != nil {
		fields = append(fields, zap.Time("not_after", pair.Leaf.NotAfter))
	}
	c.log.Info("certificate reloaded; new connections use it", fields...)
}

// failed logs a reload that keeps the previous certificate. Unreadable files
// (nil contents) are logged every time; a pair that does not parse, once.
func (c *certSource) failed(certPEM, keyPEM []byte, err error) {
	if certPEM != nil {
		c.badC, c.badK = certPEM, keyPEM
	}
	c.log.Error("certificate reload failed; the previous certificate keeps serving", zap.String("listener", c.field), zap.Error(err))
}

// watch reloads on events in the files' directories and every certPoll,
// until ctx is done.
func (c *certSource) watch(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("certificate watch panicked", zap.Any("panic", r))
		}
	}()
	var events <-chan fsnotify.Event
	var errs <-chan error
	if w, err := fsnotify.NewWatcher(); err != nil {
		c.log.Warn("cannot watch the certificate files; they are read again every minute", zap.String("listener", c.field), zap.Error(err))
	} else {
		defer func() { _ = w.Close() }()
		dirs := map[string]bool{filepath.Dir(c.certFile): true, filepath.Dir(c.keyFile): true}
		for d := range dirs {
			if err := w.Add(d); err != nil {
				c.log.Warn("cannot watch a certificate directory; its files are read again every minute", zap.String("dir", d), zap.Error(err))
			}
		}
		events, errs = w.Events, w.Errors
	}
	poll := time.NewTicker(certPoll)
	defer poll.Stop()
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			debounce = time.After(certDebounce)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			c.log.Warn("certificate watch", zap.Error(err))
		case <-debounce:
			debounce = nil
			c.reload()
		case <-poll.C:
			c.reload()
		}
	}
}

// listenerTLS builds the TLS configuration of a listener from its settings,
// with the certificate read from its files. The certificate is kept current
// by the source's watch.
func listenerTLS(field string, t config.ListenerTLS, log *zap.Logger) (*tls.Config, *certSource, error) {
	minVer := uint16(tls.VersionTLS12)
	if t.MinVersion != "" {
		v, ok := config.TLSVersions[t.MinVersion]
		if !ok {
			return nil, nil, fmt.Errorf("%s.min_version: unknown TLS version %q (want 1.2 or 1.3)", field, t.MinVersion)
		}
		minVer = v
	}
	src, err := newCertSource(field, t, log)
	if err != nil {
		return nil, nil, err
	}
	return &tls.Config{
		MinVersion:     minVer,
		GetCertificate: src.getCertificate,
		NextProtos:     []string{"http/1.1"}, // neither listener speaks HTTP/2
	}, src, nil
}

// CheckTLS reports whether the certificates of the TLS listeners in cfg
// load, naming the file and key of any that does not. validate and serve
// run it before anything listens.
func CheckTLS(cfg *config.Config) error {
	var errs []error
	for _, l := range []struct {
		field string
		t     config.ListenerTLS
	}{{"tls", cfg.TLS}, {"admin_tls", cfg.AdminTLS}} {
		if !l.t.Enabled() {
			continue
		}
		if _, _, err := listenerTLS(l.field, l.t, zap.NewNop()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// serveTLS wraps ln to serve TLS with t's certificate, kept current until
// ctx is done. A listener whose t is not enabled is returned as it is.
func (s *Server) serveTLS(ctx context.Context, field string, t config.ListenerTLS, ln net.Listener) (net.Listener, error) {
	if !t.Enabled() {
		return ln, nil
	}
	tc, src, err := listenerTLS(field, t, s.log.Named("tls"))
	if err != nil {
		return nil, err
	}
	go src.watch(ctx)
	return tls.NewListener(ln, tc), nil
}
