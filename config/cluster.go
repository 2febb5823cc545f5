package config

import (
	"context"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Cluster lets several kvroute instances share what they decide (placements,
// their lifecycle, load, session bindings, stored response ids) so that
// they route as one. Each instance runs an embedded NATS server and the
// instances form a NATS cluster among themselves (Peers or Discover), or
// all of them use an existing NATS (NATSURL). Without it (the default) an
// instance routes on its own view alone.
type Cluster struct {
	// Enabled turns sharing on. Default false.
	Enabled bool `mapstructure:"enabled"`
	// Name is the cluster's name: the NATS cluster name and the prefix of
	// its subjects; instances share only with those of the same name.
	// Default "kvroute".
	Name string `mapstructure:"name"`
	// ID names this instance in its messages, logs and metrics; unique in
	// the cluster. Default empty: the host name and a random suffix, new at
	// every start.
	ID string `mapstructure:"id"`
	// Listen is the embedded NATS server's route address (host:port), where
	// the other instances connect; unused with nats_url. Default empty:
	// this host's own address on port 6222, never a wildcard. That address
	// is the first its host name resolves to that is not loopback, else the
	// first of its interfaces'; set "0.0.0.0:6222" to listen on every
	// interface.
	Listen string `mapstructure:"listen"`
	// Peers lists the other instances' route addresses (host:port). An
	// instance may list itself: the route to itself is ignored. Default
	// empty.
	Peers []string `mapstructure:"peers"`
	// Discover is a DNS name and route port (name:port), such as a
	// Kubernetes headless service, whose addresses are the peers;
	// re-resolved every discovery.interval. Default empty.
	Discover string `mapstructure:"discover"`
	// NATSURL connects to an existing NATS (nats:// or tls:// URL, comma
	// separated for several servers) instead of embedding one; listen,
	// peers and discover are then unused. Default empty.
	NATSURL string `mapstructure:"nats_url"`
	// Token authenticates the routes between the embedded servers (and the
	// connection to nats_url when set), and keys the digests and the
	// authentication of every message: every instance must have the same.
	// Either it or tls (cert_file, key_file and ca_file) is required.
	// Default empty.
	Token string `mapstructure:"token"`
	// TLS secures the routes between the embedded servers with mutual TLS
	// (each instance presents cert_file and verifies its peers against
	// ca_file), or the connection to nats_url. Without a token, the
	// messages' key is derived from ca_file's bytes and the cluster name.
	// Default: none (a token is then required).
	TLS ClusterTLS `mapstructure:"tls"`
	// MaxPeers bounds the peers this instance keeps state for: a new
	// sender past it is ignored (counted, no resync). Default 16.
	MaxPeers int `mapstructure:"max_peers"`
	// MaxPeerPlacementBytes bounds, in bytes, the placements of one peer
	// held in their lifecycle (their keys and bookkeeping); past it that
	// peer's oldest go (counted). Default 8388608 (8 MiB).
	MaxPeerPlacementBytes int64 `mapstructure:"max_peer_placement_bytes"`
	// BatchInterval is how long an instance gathers its messages before it
	// publishes them as one. Default 1ms.
	BatchInterval time.Duration `mapstructure:"batch_interval"`
	// LoadInterval is how often an instance publishes its per-replica load
	// (requests in flight, pending prefill). It doubles as the heartbeat:
	// a peer silent for three intervals counts as gone. Default 250ms.
	LoadInterval time.Duration `mapstructure:"load_interval"`
	// JournalBytes bounds, in bytes, the record of this instance's own
	// recent placements, bindings and response ids kept to resync a peer
	// that missed messages or just joined. Default 67108864 (64 MiB).
	JournalBytes int64 `mapstructure:"journal_bytes"`
	// LeadTimeout is how long an instance waits for the cluster's leader
	// (the live instance of the lowest id) to choose the replica of a
	// request placed on load (a cold one, or a new branch of a shared
	// prefix); past it, or with 0, the instance chooses on its own view.
	// An answer takes about 0.1 ms between idle instances; the deadline
	// covers a leader busy with a burst. Default 10ms.
	LeadTimeout time.Duration `mapstructure:"lead_timeout"`
}

// ClusterTLS holds the PEM files of the cluster's route TLS.
type ClusterTLS struct {
	// CertFile is this instance's certificate, with key_file. Default
	// empty: no TLS.
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is the private key of cert_file. Default empty: no TLS.
	KeyFile string `mapstructure:"key_file"`
	// CAFile verifies the peers' certificates (and, with nats_url, the
	// server's). Required with cert_file. Default empty.
	CAFile string `mapstructure:"ca_file"`
}

func clusterDefaults() map[string]any {
	return map[string]any{
		"cluster.enabled":                  false,
		"cluster.name":                     "kvroute",
		"cluster.id":                       "",
		"cluster.listen":                   "",
		"cluster.peers":                    []string{},
		"cluster.discover":                 "",
		"cluster.nats_url":                 "",
		"cluster.token":                    "",
		"cluster.tls.cert_file":            "",
		"cluster.tls.key_file":             "",
		"cluster.tls.ca_file":              "",
		"cluster.batch_interval":           "1ms",
		"cluster.load_interval":            "250ms",
		"cluster.journal_bytes":            64 << 20,
		"cluster.lead_timeout":             "10ms",
		"cluster.max_peers":                16,
		"cluster.max_peer_placement_bytes": 8 << 20,
	}
}

// checkCluster validates the cluster section when it is enabled.
func checkCluster(c Cluster, bad func(field, format string, args ...any)) {
	if !c.Enabled {
		return
	}
	if c.Name == "" || !subjectToken(c.Name) {
		bad("cluster.name", "must be letters, digits, '-' or '_', got %q", c.Name)
	}
	if c.ID != "" && !subjectToken(c.ID) {
		bad("cluster.id", "must be letters, digits, '-' or '_', got %q", c.ID)
	}
	if c.JournalBytes <= 0 {
		bad("cluster.journal_bytes", "must be positive, got %d", c.JournalBytes)
	}
	if c.MaxPeers <= 0 {
		bad("cluster.max_peers", "must be positive, got %d", c.MaxPeers)
	}
	if c.MaxPeerPlacementBytes <= 0 {
		bad("cluster.max_peer_placement_bytes", "must be positive, got %d", c.MaxPeerPlacementBytes)
	}
	checkClusterCredentials(c, bad)
	if c.NATSURL != "" {
		for i, u := range splitComma(c.NATSURL) {
			p, err := url.Parse(u)
			if err != nil || (p.Scheme != "nats" && p.Scheme != "tls") || p.Host == "" {
				bad("cluster.nats_url", "server %d: %q is not a nats:// or tls:// URL", i+1, u)
			}
		}
		return
	}
	if c.Listen != "" {
		if err := checkAddr(c.Listen); err != nil {
			bad("cluster.listen", "%v", err)
		}
	}
	for i, p := range c.Peers {
		if err := checkHostPort(p); err != nil {
			bad("cluster.peers["+strconv.Itoa(i)+"]", "%v", err)
		}
	}
	if c.Discover != "" {
		if err := checkHostPort(c.Discover); err != nil {
			bad("cluster.discover", "%v", err)
		}
	}
}

// checkClusterCredentials requires what admits members only: the route
// token, or mutual TLS (a certificate, its key and the CA the peers'
// are verified against).
func checkClusterCredentials(c Cluster, bad func(field, format string, args ...any)) {
	t := c.TLS
	tlsSet := t.CertFile != "" || t.KeyFile != "" || t.CAFile != ""
	if tlsSet && (t.CertFile == "" || t.KeyFile == "" || t.CAFile == "") {
		bad("cluster.tls", "cert_file, key_file and ca_file go together (mutual TLS), got cert_file %q, key_file %q, ca_file %q",
			t.CertFile, t.KeyFile, t.CAFile)
	}
	if c.Token == "" && c.NATSURL != "" {
		// Mutual TLS admits the server's clients, not only this cluster's
		// instances, and the CA certificate it would derive the message key
		// from is no secret: another client of that server could forge.
		bad("cluster.token", "is required with cluster.nats_url: other clients of that server can write the cluster's subjects, "+
			"and the messages are authenticated with a key derived from the token")
		return
	}
	if c.Token == "" && !tlsSet {
		bad("cluster.token", "the cluster admits members only: set cluster.token (the same secret on every instance), "+
			"or cluster.tls.cert_file, cluster.tls.key_file and cluster.tls.ca_file (mutual TLS)")
	}
}

// DefaultClusterPort is the route port of cluster.listen's default.
const DefaultClusterPort = "6222"

// ClusterListen returns the route address the embedded server listens on:
// listen when set, else this host's own address on DefaultClusterPort,
// the first of: the addresses the host name resolves to that are not
// loopback, then the first global unicast address of the host's
// interfaces (in their order), then 127.0.0.1 (a host with no network).
func ClusterListen(listen string) string {
	if listen != "" {
		return listen
	}
	return net.JoinHostPort(hostAddr(), DefaultClusterPort)
}

// hostAddr is ClusterListen's host.
func hostAddr() string {
	if name, err := os.Hostname(); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ips, err := net.DefaultResolver.LookupIPAddr(ctx, name)
		cancel()
		for _, ip := range ips {
			if err == nil && ip.IP.IsGlobalUnicast() {
				return ip.IP.String()
			}
		}
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

// checkHostPort checks a host:port with a port from 1 to 65535.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" {
		return &net.AddrError{Err: "missing host", Addr: s}
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return &net.AddrError{Err: "bad port", Addr: s}
	}
	return nil
}

// subjectToken reports whether s can be one token of a NATS subject.
func subjectToken(s string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
		if !ok {
			return false
		}
	}
	return s != ""
}

// splitComma splits a comma-separated list, dropping empty items.
func splitComma(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
}
