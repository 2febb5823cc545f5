package config

import (
	"net"
	"net/url"
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
	// the other instances connect. Default "0.0.0.0:6222". Unused with
	// nats_url.
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
	// connection to nats_url when set): every instance must have the same.
	// Default empty: none.
	Token string `mapstructure:"token"`
	// TLS secures the routes between the embedded servers (mutual TLS when
	// ca_file is set: each instance presents cert_file and verifies its
	// peers against ca_file). Default: plain TCP.
	TLS ClusterTLS `mapstructure:"tls"`
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
	// CertFile and KeyFile are this instance's certificate and key.
	// Default empty: no TLS.
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
	// CAFile verifies the peers' certificates. Default empty: the system
	// roots.
	CAFile string `mapstructure:"ca_file"`
}

func clusterDefaults() map[string]any {
	return map[string]any{
		"cluster.enabled":        false,
		"cluster.name":           "kvroute",
		"cluster.id":             "",
		"cluster.listen":         "0.0.0.0:6222",
		"cluster.peers":          []string{},
		"cluster.discover":       "",
		"cluster.nats_url":       "",
		"cluster.token":          "",
		"cluster.tls.cert_file":  "",
		"cluster.tls.key_file":   "",
		"cluster.tls.ca_file":    "",
		"cluster.batch_interval": "1ms",
		"cluster.load_interval":  "250ms",
		"cluster.journal_bytes":  64 << 20,
		"cluster.lead_timeout":   "10ms",
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
	if c.NATSURL != "" {
		for i, u := range splitComma(c.NATSURL) {
			p, err := url.Parse(u)
			if err != nil || (p.Scheme != "nats" && p.Scheme != "tls") || p.Host == "" {
				bad("cluster.nats_url", "server %d: %q is not a nats:// or tls:// URL", i+1, u)
			}
		}
		return
	}
	if err := checkAddr(c.Listen); err != nil {
		bad("cluster.listen", "%v", err)
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
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("cluster.tls", "cert_file and key_file go together")
	}
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
