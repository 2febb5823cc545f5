package backends

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Engine names the inference server software a replica runs; it selects which
// metric names [ParseMetrics] reads.
type Engine string

// Known engines.
const (
	EngineVLLM   Engine = "vllm"
	EngineSGLang Engine = "sglang"
)

// Known reports whether e is an engine this package can read metrics from.
func (e Engine) Known() bool { return e == EngineVLLM || e == EngineSGLang }

// Spec is one replica's configuration. It is copied on use: changing a Spec
// (or its Models slice) after handing it to [NewFleet] or [Fleet.Update] has no
// effect.
type Spec struct {
	// Name identifies the replica in logs, metrics and reloads; required and
	// unique within a fleet.
	Name string
	// URL is the replica's base address, "http://host:port" or
	// "https://host:port", optionally followed by a base path
	// ("http://host:8000/engine-a") that prefixes every request sent to the
	// replica, proxied or check; no query, fragment or credentials. A
	// trailing "/" is dropped. A missing port defaults to 80 or 443.
	URL string
	// TLS configures the connections to an https URL (see [TLS]).
	TLS TLS
	// Engine selects the metric names read from /metrics; required.
	Engine Engine
	// Models is an optional static list of served model ids. When empty the
	// list is fetched from GET /v1/models with every health check.
	Models []string
	// Discover marks URL's host as a DNS name to resolve into one replica per
	// address (see [Expand]). The fleet itself only takes expanded specs.
	Discover bool
	// CacheTokens, when positive, is the replica's prefix-cache capacity in
	// tokens across all its cache tiers; it overrides what its metrics say
	// (see [Replica.CacheTokens]).
	CacheTokens int64
	// Weight is the replica's relative capacity, as nginx's upstream weight:
	// round-robin, the load bound and least-load placement give it Weight
	// times the share of a weight-1 replica. 0 means 1; negative, NaN and
	// infinite weights are rejected (see [Replica.Weight]).
	Weight float64
	// Backup keeps the replica out of routing while any primary (non-backup)
	// replica serving the request's model is available and not yet tried
	// for the request (see [Replica.Backup]).
	Backup bool
	// KVEvents is where the replica's engine publishes its KV cache events
	// (precise mode); the zero value: none. The fleet only carries it.
	KVEvents KVEvents
	// DataParallelSize is the number of data-parallel ranks the engine runs
	// behind URL, each with its own KV cache (vLLM --data-parallel-size,
	// SGLang --dp-size). A spec with more than one stands for them all
	// until [Expand] turns it into one replica per rank (see
	// [ExpandRanks]). 0 and 1 mean one rank, addressed as the engine's
	// own balancer pleases.
	DataParallelSize int
	// DataParallelRank is, in a spec of DataParallelSize > 1, the rank the
	// replica stands for, 0 ≤ rank < DataParallelSize: requests sent to it
	// carry X-Data-Parallel-Rank (which vLLM and SGLang both honour), and
	// its metrics are that rank's series ([ParseRankMetrics]).
	DataParallelRank int
	// Role is the replica's part in a disaggregated fleet (see [Role]);
	// "" is RoleBoth.
	Role Role
	// BootstrapPort is the port of an SGLang prefill replica's bootstrap
	// server; 0 means DefaultBootstrapPort.
	BootstrapPort int
}

// KVEvents is a replica's KV-event publisher.
type KVEvents struct {
	// Endpoint is the engine's ZMQ PUB socket ("tcp://10.0.0.5:5557"); with
	// Bind, the address kvroute listens on for the engine to connect.
	Endpoint string
	// Bind: kvroute listens on Endpoint and the engine's publisher dials.
	Bind bool
	// AllowFrom, with Bind, is the peers admitted: comma-separated IP
	// prefixes ("10.0.0.0/8,10.1.2.3/32"), or "" for the addresses the
	// replica's URL host resolves to. A string, so that the struct
	// compares with ==.
	AllowFrom string
	// ReplayEndpoint is its ROUTER replay socket; "" for none.
	ReplayEndpoint string
	// Topic filters messages by prefix ("" for all).
	Topic string
}

// Options tunes the fleet. The zero value of every field selects its default.
type Options struct {
	// HealthInterval is the period of GET /health (and GET /v1/models when a
	// spec lists no models). Default 2s.
	HealthInterval time.Duration
	// HealthTimeout bounds each health or models request. Default 1s.
	HealthTimeout time.Duration
	// MetricsInterval is the period of GET /metrics. Default 250ms.
	MetricsInterval time.Duration
	// MetricsTimeout bounds each metrics request. Default 1s.
	MetricsTimeout time.Duration
	// StaleAfter is the age beyond which a snapshot is stale (see
	// [Replica.Fresh]). Default 4×MetricsInterval, at least 1s.
	StaleAfter time.Duration
	// FailThreshold is the number of consecutive failed requests, or of
	// consecutive failed health checks (counted apart), that ejects a
	// replica. Default 3.
	FailThreshold int
	// ConnectTimeout bounds each dial to a replica, TCP connect plus TLS
	// handshake for https. Default 2s.
	ConnectTimeout time.Duration
	// MaxConnsPerReplica caps the pooled connections of [Replica.Client]; each
	// streaming generation holds one for its whole life. Default 1024.
	MaxConnsPerReplica int
	// MaxConnWaitTimeout is how long a request waits for a free connection
	// when the pool is full. The default 0 fails fast with
	// fasthttp.ErrNoFreeConns, so the router can pick another replica at once
	// instead of queueing behind a saturated one; a full pool is a load signal.
	MaxConnWaitTimeout time.Duration
	// TLSConfig is the base TLS client configuration for https replicas,
	// cloned per replica, then given the replica's [Spec.TLS] settings,
	// TLS 1.2 or later, and ServerName set to the replica's host unless
	// either sets one. Nil uses the system roots.
	TLSConfig *tls.Config
	// Dial, when set, dials the TCP connections of [Replica.Client]
	// (proxied traffic) instead of the built-in dialer. It should honour
	// ConnectTimeout itself. For https replicas the TLS handshake then runs
	// over the returned connection, bounded by ConnectTimeout through its
	// deadlines. Health, models and metrics checks always use the built-in
	// dialer. Nil: built-in dialer.
	Dial func(addr string) (net.Conn, error)
	// FirstByteTimeout is how long a request sent through [Replica.Client]
	// waits for the first byte of its answer; StreamIdleTimeout, how long
	// each later read of the answer may wait. Both are read deadlines on
	// the connection (for https, on the TLS connection's plaintext), so a
	// long generation that keeps streaming is never cut; each read may time
	// out up to 1/[DeadlineSlack] of the wait early. [Fleet.SetTimeouts]
	// changes them. Checks have their own timeouts (HealthTimeout,
	// MetricsTimeout). Default 0: no such deadline.
	FirstByteTimeout  time.Duration
	StreamIdleTimeout time.Duration
}

// Defaults.
const (
	DefaultHealthInterval     = 2 * time.Second
	DefaultHealthTimeout      = time.Second
	DefaultMetricsInterval    = 250 * time.Millisecond
	DefaultMetricsTimeout     = time.Second
	DefaultFailThreshold      = 3
	DefaultConnectTimeout     = 2 * time.Second
	DefaultMaxConnsPerReplica = 1024
	minStaleAfter             = time.Second
)

// withDefaults validates o and fills in the defaults of zero fields.
func (o Options) withDefaults() (Options, error) {
	durs := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"HealthInterval", &o.HealthInterval, DefaultHealthInterval},
		{"HealthTimeout", &o.HealthTimeout, DefaultHealthTimeout},
		{"MetricsInterval", &o.MetricsInterval, DefaultMetricsInterval},
		{"MetricsTimeout", &o.MetricsTimeout, DefaultMetricsTimeout},
		{"ConnectTimeout", &o.ConnectTimeout, DefaultConnectTimeout},
		{"FirstByteTimeout", &o.FirstByteTimeout, 0},
		{"StreamIdleTimeout", &o.StreamIdleTimeout, 0},
	}
	for _, d := range durs {
		if *d.v < 0 {
			return o, fmt.Errorf("backends: option %s is negative (%v)", d.name, *d.v)
		}
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if o.StaleAfter < 0 {
		return o, fmt.Errorf("backends: option StaleAfter is negative (%v)", o.StaleAfter)
	}
	if o.StaleAfter == 0 {
		o.StaleAfter = max(4*o.MetricsInterval, minStaleAfter)
	}
	if o.MaxConnWaitTimeout < 0 {
		return o, fmt.Errorf("backends: option MaxConnWaitTimeout is negative (%v)", o.MaxConnWaitTimeout)
	}
	if o.FailThreshold < 0 {
		return o, fmt.Errorf("backends: option FailThreshold is negative (%d)", o.FailThreshold)
	}
	if o.FailThreshold == 0 {
		o.FailThreshold = DefaultFailThreshold
	}
	if o.MaxConnsPerReplica < 0 {
		return o, fmt.Errorf("backends: option MaxConnsPerReplica is negative (%d)", o.MaxConnsPerReplica)
	}
	if o.MaxConnsPerReplica == 0 {
		o.MaxConnsPerReplica = DefaultMaxConnsPerReplica
	}
	return o, nil
}

// target is a validated replica address.
type target struct {
	addr   string // host:port, for fasthttp.HostClient.Addr
	host   string // host alone, for TLS server name verification
	tls    bool
	origin string // scheme://host:port, normalised
	path   string // base path, escaped, without a trailing "/"; "" for none
	base   string // origin+path: identity for reloads and prefix of check URIs

	tlsSpec  TLS      // the spec's TLS settings, part of the identity
	tlsFiles tlsFiles // what tlsSpec's files hold
}

// parseURL validates a Spec.URL and returns its address.
func parseURL(raw string) (target, error) {
	if raw == "" {
		return target{}, errors.New("URL is empty")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return target{}, fmt.Errorf("URL %q: %w", raw, err)
	}
	var tls bool
	var defPort string
	switch u.Scheme {
	case "http":
		defPort = "80"
	case "https":
		tls, defPort = true, "443"
	default:
		return target{}, fmt.Errorf("URL %q: scheme must be http or https", raw)
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		return target{}, fmt.Errorf("URL %q: only scheme://host:port with an optional base path is allowed", raw)
	}
	path := strings.TrimRight(u.EscapedPath(), "/")
	host := u.Hostname()
	if host == "" {
		return target{}, fmt.Errorf("URL %q: host is empty", raw)
	}
	port := u.Port()
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return target{}, fmt.Errorf("URL %q: port is empty", raw)
		}
		port = defPort
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return target{}, fmt.Errorf("URL %q: bad port %q", raw, port)
	}
	addr := net.JoinHostPort(strings.ToLower(host), port)
	origin := u.Scheme + "://" + addr
	return target{addr: addr, host: strings.ToLower(host), tls: tls, origin: origin, path: path, base: origin + path}, nil
}

// ValidateSpecs checks specs as [NewFleet] and [Fleet.Update] do, without
// building anything: names non-empty and unique, URLs valid, TLS files
// readable, engines known, model ids non-empty. A configuration loader can
// call it to reject a bad file before swapping it in.
func ValidateSpecs(specs []Spec) error {
	_, err := validateSpecs(specs)
	return err
}

func validateSpecs(specs []Spec) ([]target, error) {
	seen := make(map[string]struct{}, len(specs))
	targets := make([]target, len(specs))
	for i, s := range specs {
		if s.Name == "" {
			return nil, fmt.Errorf("backends: replica #%d: name is empty", i)
		}
		if _, dup := seen[s.Name]; dup {
			return nil, fmt.Errorf("backends: replica %q: duplicate name", s.Name)
		}
		seen[s.Name] = struct{}{}
		t, err := parseURL(s.URL)
		if err != nil {
			return nil, fmt.Errorf("backends: replica %q: %w", s.Name, err)
		}
		t.tlsSpec = s.TLS
		if t.tlsFiles, err = s.TLS.load(); err != nil {
			return nil, fmt.Errorf("backends: replica %q: %w", s.Name, err)
		}
		if !s.Engine.Known() {
			return nil, fmt.Errorf("backends: replica %q: unknown engine %q (want %q or %q)",
				s.Name, s.Engine, EngineVLLM, EngineSGLang)
		}
		for _, m := range s.Models {
			if m == "" {
				return nil, fmt.Errorf("backends: replica %q: empty model id", s.Name)
			}
		}
		if err := checkWeight(s.Weight); err != nil {
			return nil, fmt.Errorf("backends: replica %q: %w", s.Name, err)
		}
		if err := checkRank(s); err != nil {
			return nil, fmt.Errorf("backends: replica %q: %w", s.Name, err)
		}
		if err := checkRole(s); err != nil {
			return nil, fmt.Errorf("backends: replica %q: %w", s.Name, err)
		}
		targets[i] = t
	}
	return targets, nil
}

// cloneSpec returns s with its own copy of Models.
func cloneSpec(s Spec) Spec {
	if s.Models != nil {
		s.Models = append([]string(nil), s.Models...)
	}
	return s
}
