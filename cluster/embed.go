package cluster

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
)

// embedded is the NATS server an instance runs in-process. Peers connect
// to its routes (cluster.listen). Its own connection is in-process; the
// client port the server needs to run routes listens on loopback only, on
// a port of the kernel's choosing, behind a random token only this
// instance knows.
type embedded struct {
	ns *natsserver.Server
	// token is the client port's secret (Options.Authorization).
	token string
	log   *zap.Logger
	cfg   config.Cluster
	mu    sync.Mutex
	opts  *natsserver.Options // as last applied
}

// routeUser is the route user name; cluster.token is its password.
const routeUser = "kvroute"

// startEmbedded starts the embedded server with routes to the configured
// peers (and, when cluster.discover is set, to its addresses as first
// resolved).
func startEmbedded(c config.Cluster, id string, log *zap.Logger) (*embedded, error) {
	listen := config.ClusterListen(c.Listen)
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("cluster.listen: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("cluster.listen: bad port %q", portStr)
	}
	if port == 0 {
		port = natsserver.RANDOM_PORT
	}
	opts := &natsserver.Options{
		ServerName:    id,
		Host:          "127.0.0.1",
		Port:          natsserver.RANDOM_PORT,
		Authorization: clientToken(),
		NoSigs:        true,
		MaxPayload:    8 << 20,
		Cluster: natsserver.ClusterOpts{
			Name: c.Name,
			Host: host,
			Port: port,
		},
	}
	if c.Token != "" {
		opts.Cluster.Username, opts.Cluster.Password = routeUser, c.Token
	}
	if c.TLS.CertFile != "" {
		tc, err := routeTLS(c.TLS)
		if err != nil {
			return nil, err
		}
		opts.Cluster.TLSConfig, opts.Cluster.TLSTimeout = tc, 2
	}
	e := &embedded{log: log, cfg: c}
	opts.Routes = e.routeURLs(c.Peers, e.resolve(context.Background()))
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("cluster: embedded NATS: %w", err)
	}
	ns.SetLoggerV2(natsLogger{log.Named("nats")}, false, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("cluster: embedded NATS did not start listening on %s", listen)
	}
	e.ns, e.opts, e.token = ns, opts, opts.Authorization
	return e, nil
}

// clientToken is a random secret for the embedded server's client port.
func clientToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// routeTLS builds the routes' TLS: this instance's certificate, and the
// peers' verified against ca_file both ways (mutual TLS: a route that
// presents no certificate the CA signed is refused).
func routeTLS(t config.ClusterTLS) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.tls: %w", err)
	}
	if t.CAFile == "" {
		return nil, errors.New("cluster.tls.ca_file: required with cert_file (the peers are verified against it)")
	}
	pem, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, fmt.Errorf("cluster.tls.ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("cluster.tls.ca_file: no PEM certificate in it")
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		RootCAs: pool, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}, nil
}

// routeURLs turns host:port addresses into route URLs, with the token.
func (e *embedded) routeURLs(lists ...[]string) []*url.URL {
	var out []*url.URL
	seen := map[string]bool{}
	for _, l := range lists {
		for _, a := range l {
			if seen[a] {
				continue
			}
			seen[a] = true
			u := &url.URL{Scheme: "nats-route", Host: a}
			if e.cfg.Token != "" {
				u.User = url.UserPassword(routeUser, e.cfg.Token)
			}
			out = append(out, u)
		}
	}
	return out
}

// resolve returns cluster.discover's addresses as host:port, sorted (none
// when it is unset or does not resolve).
func (e *embedded) resolve(ctx context.Context) []string {
	if e.cfg.Discover == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(e.cfg.Discover)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		e.log.Warn("cluster: discover did not resolve; keeping the routes known", zap.String("discover", e.cfg.Discover), zap.Error(err))
		return nil
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.JoinHostPort(a, port))
	}
	slices.Sort(out)
	return out
}

// discoverLoop re-resolves cluster.discover every interval and points the
// routes at its addresses (and the static peers) when they changed, until
// ctx ends. A route to this instance itself is dropped by the server.
func (e *embedded) discoverLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		found := e.resolve(ctx)
		if len(found) == 0 {
			continue
		}
		routes := e.routeURLs(e.cfg.Peers, found)
		e.mu.Lock()
		same := slices.EqualFunc(routes, e.opts.Routes, func(a, b *url.URL) bool { return a.String() == b.String() })
		if !same {
			next := e.opts.Clone()
			next.Routes = routes
			if err := e.ns.ReloadOptions(next); err != nil {
				e.log.Warn("cluster: could not apply the discovered routes", zap.Error(err))
			} else {
				e.opts = next
				e.log.Info("cluster: routes follow discovery", zap.Int("addresses", len(found)))
			}
		}
		e.mu.Unlock()
	}
}

// hasPeers reports whether any route is configured or discovered.
func (e *embedded) hasPeers() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.opts.Routes) > 0 || e.cfg.Discover != ""
}

// routeAddr returns the route listener's address.
func (e *embedded) routeAddr() string {
	if a := e.ns.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

func (e *embedded) stop() {
	e.ns.Shutdown()
	e.ns.WaitForShutdown()
}

// natsLogger writes the embedded server's log lines to zap: notices at
// debug level (routes come and go as peers do), its errors at info level
// (a route to a peer that is down fails every second: the Node logs once
// that no peer is reachable), warnings as warnings.
type natsLogger struct{ l *zap.Logger }

func (n natsLogger) Noticef(format string, v ...any) { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Warnf(format string, v ...any)   { n.l.Warn(fmt.Sprintf(format, v...)) }
func (n natsLogger) Fatalf(format string, v ...any)  { n.l.Error(fmt.Sprintf(format, v...)) }
func (n natsLogger) Errorf(format string, v ...any)  { n.l.Info(fmt.Sprintf(format, v...)) }
func (n natsLogger) Debugf(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
func (n natsLogger) Tracef(format string, v ...any)  { n.l.Debug(fmt.Sprintf(format, v...)) }
