// Package config defines kvroute's configuration, loads it from a YAML file,
// KVROUTE_* environment variables and command-line flags (in rising order of
// precedence), decodes it strictly and validates it.
package config

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"reflect"
	"strings"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/router"
)

// Config is the whole of kvroute's configuration. Every field's comment
// states its unit and default: docs/configuration.md is generated from
// them (go run ./config/gen), and config.yaml is the commented example.
type Config struct {
	// Listen is the proxy listener address. Default "127.0.0.1:8080".
	Listen string `mapstructure:"listen"`
	// AdminListen is the admin listener (metrics, health, debug). Default
	// "127.0.0.1:9090"; empty disables it.
	AdminListen string `mapstructure:"admin_listen"`
	// Policy is the routing policy, by its name in the router's registry
	// (the policies section lists them). Default cache_aware.
	Policy string `mapstructure:"policy"`
	// Policies holds each policy's settings, in a section named after the
	// policy; a policy reads its own at every decision, and a reload
	// changes them in place.
	Policies any `mapstructure:"policies"`
	// Backends is the replica list; at least one is required.
	Backends []Backend `mapstructure:"backends"`
	// Limits bounds what a client may send.
	Limits Limits `mapstructure:"limits"`
	// Retries is the number of extra attempts on another replica, made only
	// before any response byte reached the client. Default 1.
	Retries int `mapstructure:"retries"`
	// Timeouts bound the waits of the forwarding path.
	Timeouts Timeouts `mapstructure:"timeouts"`
	// Health configures active health checks and ejection.
	Health Health `mapstructure:"health"`
	// Metrics configures the polling of each replica's /metrics.
	Metrics Metrics `mapstructure:"metrics"`
	// Tokenizer builds routing keys.
	Tokenizer Tokenizer `mapstructure:"tokenizer"`
	// Index is the fleet's cache state as kvroute knows it: the prefix
	// tree the policies read, shared by all of them and kept across
	// reloads.
	Index Index `mapstructure:"index"`
	// DeprecatedCacheAware is Deprecated: its keys are read as
	// policies.cache_aware's, and ttl, block_size, default_budget_tokens and
	// tree_max_bytes as index's, with a warning. Nothing reads this field.
	DeprecatedCacheAware LegacyCacheAware `mapstructure:"cache_aware"`
	// Session configures session affinity.
	Session Session `mapstructure:"session"`
	// Flow configures flow control: tenant limits and the gateway queue.
	Flow Flow `mapstructure:"flow"`
	// CacheSalt has kvroute set each request's cache_salt for its tenant.
	CacheSalt CacheSalt `mapstructure:"cache_salt"`
	// Disaggregation configures fleets whose replicas split prefill and
	// decode (backends[].role).
	Disaggregation Disaggregation `mapstructure:"disaggregation"`
	// Discovery re-resolves DNS-named backends.
	Discovery Discovery `mapstructure:"discovery"`
	// Auth guards the proxy and admin listeners.
	Auth Auth `mapstructure:"auth"`
	// Log configures logging.
	Log Log `mapstructure:"log"`
	// TLS serves the proxy listener over TLS when cert_file and key_file
	// are set. Default: plain HTTP.
	TLS ListenerTLS `mapstructure:"tls"`
	// AdminTLS serves the admin listener over TLS when cert_file and
	// key_file are set. Default: plain HTTP.
	AdminTLS ListenerTLS `mapstructure:"admin_tls"`
	// UpstreamTLS configures connections to https:// replicas; a backend's
	// own upstream_tls overrides the fields it sets.
	UpstreamTLS UpstreamTLS `mapstructure:"upstream_tls"`
	// ExposeBackendNames, when true, names the replica in X-Kvroute-*
	// response headers and in error bodies; false hides them from clients
	// (logs and metrics still name it). Default true.
	ExposeBackendNames bool `mapstructure:"expose_backend_names"`
	// ExposeRouteReason, when true, sends every routed answer's
	// X-Kvroute-Route (why its replica was chosen, with the prompt tokens
	// it was believed to hold: "cache_hit matched=1536"), unless
	// expose_backend_names is false, and puts the match length in
	// /debug/route's answers without auth.admin_token. Default false: no
	// answer carries X-Kvroute-Route, which would tell any client whether
	// another client's prompt is cached (a prefix oracle).
	ExposeRouteReason bool `mapstructure:"expose_route_reason"`
	// Responses bounds the table of stored Responses-API ids.
	Responses Responses `mapstructure:"responses"`
	// Cluster shares routing state with other kvroute instances. Default:
	// off.
	Cluster Cluster `mapstructure:"cluster"`
	// Precise routes on the engines' KV events and own tokens. Default: off.
	Precise Precise `mapstructure:"precise"`
	// Deprecated lists, one line each, the deprecated keys the
	// configuration set, with where and what replaced them; they were read
	// as their replacements.
	Deprecated []string `mapstructure:"-"`
}

// ListenerTLS is a listener's server certificate. Both files are PEM; they
// are read again when they change on disk (certificate rotation).
type ListenerTLS struct {
	// CertFile is the certificate chain. Default empty (no TLS).
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is the private key. Default empty (no TLS).
	KeyFile string `mapstructure:"key_file"`
	// MinVersion is the lowest TLS version accepted: "1.2" or "1.3".
	// Default "1.2".
	MinVersion string `mapstructure:"min_version"`
}

// Enabled reports whether the listener serves TLS.
func (t ListenerTLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// UpstreamTLS configures TLS to https:// replicas. All fields are optional.
type UpstreamTLS struct {
	// CAFile is a PEM bundle of CAs that sign the replicas' certificates.
	// Default empty: the system roots.
	CAFile string `mapstructure:"ca_file"`
	// CertFile is a PEM client certificate presented to replicas (mutual
	// TLS), with key_file. Default empty: none.
	CertFile string `mapstructure:"cert_file"`
	// KeyFile is the PEM private key of cert_file. Default empty: none.
	KeyFile string `mapstructure:"key_file"`
	// ServerName is the name sent as SNI and verified in the replica's
	// certificate. Default empty: the URL's host.
	ServerName string `mapstructure:"server_name"`
	// InsecureSkipVerify turns certificate verification off. Default false.
	InsecureSkipVerify bool `mapstructure:"insecure_skip_verify"`
}

// Merge returns t with the fields o sets (non-empty strings, a true
// InsecureSkipVerify) replaced by o's.
func (t UpstreamTLS) Merge(o *UpstreamTLS) UpstreamTLS {
	if o == nil {
		return t
	}
	for _, f := range []struct{ dst, src *string }{{&t.CAFile, &o.CAFile}, {&t.CertFile, &o.CertFile}, {&t.KeyFile, &o.KeyFile}, {&t.ServerName, &o.ServerName}} {
		if *f.src != "" {
			*f.dst = *f.src
		}
	}
	if o.InsecureSkipVerify {
		t.InsecureSkipVerify = true
	}
	return t
}

// Responses bounds the table that maps Responses-API ids to the replica
// that stored them.
type Responses struct {
	// TTL after which an id is forgotten. Default 1h.
	TTL time.Duration `mapstructure:"ttl"`
	// MaxEntries bounds the ids kept; the least recently used go first.
	// Default 100000.
	MaxEntries int `mapstructure:"max_entries"`
}

// Backend is one replica.
type Backend struct {
	// Name identifies the replica in headers, logs and metrics. Required, unique.
	Name string `mapstructure:"name"`
	// URL is the replica's base URL, http://host:port or https://host:port,
	// optionally with a base path prefixed to every forwarded path
	// (http://host:8000/engine-a). Required.
	URL string `mapstructure:"url"`
	// Engine names the replica's engine, vllm or sglang: which metric names
	// to read. Default vllm.
	Engine string `mapstructure:"engine"`
	// Models lists the models (or LoRA adapters) the replica serves.
	// Default empty: read from its GET /v1/models with every health check.
	Models []string `mapstructure:"models"`
	// Discover, when true, treats the URL's host as a DNS name (such as a
	// Kubernetes headless service) re-resolved every discovery.interval, each
	// address a replica named "<name>-<address>". Default false.
	Discover bool `mapstructure:"discover"`
	// CacheTokens is the replica's prefix-cache capacity in tokens, counting
	// every tier the engine reuses prefixes from: GPU KV plus a host-memory
	// offload tier (vLLM with CPU offloading or LMCache, SGLang HiCache),
	// whose size the engine's metrics do not report. Default 0: from the
	// replica's metrics (vllm:cache_config_info num_gpu_blocks × block_size,
	// sglang:max_total_num_tokens), else cache_aware.default_budget_tokens.
	CacheTokens int64 `mapstructure:"cache_tokens"`
	// Weight is the replica's relative capacity (as nginx's upstream
	// weight), for fleets of mixed GPU types: the load bound, cold
	// placement and round-robin give it weight times a weight-1 replica's
	// share. Default 1.
	Weight float64 `mapstructure:"weight"`
	// Backup, when true, keeps the replica out of routing while any
	// primary (non-backup) replica is available. Default false.
	Backup bool `mapstructure:"backup"`
	// UpstreamTLS overrides the global upstream_tls fields it sets, for
	// this replica. Default: none.
	UpstreamTLS *UpstreamTLS `mapstructure:"upstream_tls"`
	// KVEvents is where the replica's engine publishes its KV cache events
	// (precise mode). Default: none.
	KVEvents *KVEvents `mapstructure:"kv_events"`
	// DataParallelSize is the number of data-parallel ranks the engine
	// runs behind url, each with its own KV cache (vLLM
	// --data-parallel-size behind one API server, SGLang --dp-size). Each
	// rank r is routed as its own replica, "<name>-dp<r>": its requests
	// carry X-Data-Parallel-Rank: r, its load is its own series of the
	// engine's metrics, and its kv_events are read on the endpoint's port
	// + r (the replay endpoint's likewise), where the engine's rank r
	// publishes them. 1..1024 (0 means 1). Default 1.
	DataParallelSize int `mapstructure:"data_parallel_size"`
	// Role is the replica's part in a disaggregated fleet: prefill (it
	// computes prompts' KV caches and hands them over), decode (it
	// generates from a KV cache handed over) or both (an ordinary
	// replica, which may also serve either side). A fleet may mix them;
	// with any prefill or decode replica, chat and completions requests go
	// to a prefill and a decode replica in the engines' protocol
	// (disaggregation.protocol). Default both.
	Role string `mapstructure:"role"`
	// BootstrapPort is the port of an SGLang prefill replica's bootstrap
	// server (its --disaggregation-bootstrap-port), sent to the decode
	// replica with each request. 1-65535; 0 means 8998, SGLang's default.
	// Default 0.
	BootstrapPort int `mapstructure:"bootstrap_port"`
}

// Disaggregation configures a fleet of prefill and decode replicas.
type Disaggregation struct {
	// Protocol is how the prefill and decode replicas of a request are
	// told of each other: vllm (the prefill replica answers
	// kv_transfer_params, which go to the decode replica with the request;
	// vLLM with a KV connector such as NIXL or Mooncake) or sglang (both
	// get the request at once with bootstrap_host, bootstrap_port and
	// bootstrap_room; SGLang --disaggregation-mode). Required when any
	// backend's role is prefill or decode. Default empty.
	Protocol string `mapstructure:"protocol"`
	// LocalPrefillTokens, with protocol vllm, lets a decode replica
	// compute a prompt itself when it is believed to hold all of it but
	// at most this many tokens (a conversation's next turn on the replica
	// that decoded the last): the request goes to it whole, as to an
	// undisaggregated replica, and no prefill replica is asked. The
	// decode engines must then serve plain requests too, as vLLM does
	// with kv_role kv_both (NIXL's documented setting); the few tokens
	// computed there take a step of its decode batch. Needs the
	// cache_aware policy (its Index); SGLang's decode replicas cannot
	// run a request without its prefill. Tokens, 0 or more; 0 means
	// never. Default 0.
	LocalPrefillTokens int `mapstructure:"local_prefill_tokens"`
	// LocalPrefillBacklog, with protocol vllm and the cache_aware policy,
	// lets a decode replica compute a prompt itself while the prefill
	// replicas are behind: when every prefill replica has at least this
	// many prompt tokens waiting for their prefill (sent by this kvroute
	// and its cluster's peers, per unit of weight), a decode replica computing no prompt of its own
	// takes the request whole if it has fewer of the prompt's tokens to
	// compute than the least behind prefill replica has waiting and to
	// compute together. With every prefill replica down it takes any.
	// For a fleet with too few prefill replicas for its load: the time to
	// the first token then stays near the prefill time rather than
	// growing with the queue, and the decode batches the prompts join pay
	// with a longer time per output token. The decode engines must serve
	// plain requests (kv_role kv_both). Tokens, 0 or more; 0 means never.
	// Default 0.
	LocalPrefillBacklog int `mapstructure:"local_prefill_backlog"`
	// LocalPrefillMaxRunning bounds what local_prefill_backlog costs the
	// decode batches: a decode replica takes a prompt for a prefill side
	// that is behind only while it has fewer than this many requests in
	// flight (from every kvroute of a cluster) and its engine reports
	// fewer running and waiting, by metrics still fresh (without them,
	// none); 1 takes only an idle one. Fewer decodes then share steps with
	// the prompt's prefill, and fewer prompts are taken off the prefill
	// replicas. Requests, 0 or more; 0 means any number. Default 0.
	LocalPrefillMaxRunning int `mapstructure:"local_prefill_max_running"`
}

// Discovery configures DNS re-resolution of backends with discover: true.
type Discovery struct {
	// Interval between resolutions. Default 10s.
	Interval time.Duration `mapstructure:"interval"`
}

// Limits bounds client input.
type Limits struct {
	// MaxBodyBytes is the largest request body in bytes; larger gets 413.
	// Default 8388608 (8 MiB).
	MaxBodyBytes int `mapstructure:"max_body_bytes"`
	// MaxBodyBufferBytes bounds, in bytes, the buffers held at once by the
	// request bodies being read or forwarded, across all connections; a
	// body that would pass it gets 503 body_budget_exhausted with
	// Retry-After. At least what one body of max_body_bytes holds while it
	// is read: the power of two at or above max_body_bytes (at least
	// 4 KiB), times 1.5 when max_body_bytes is over 8 KiB. Default
	// 268435456 (256 MiB).
	MaxBodyBufferBytes int `mapstructure:"max_body_buffer_bytes"`
	// MaxConnsPerReplica caps pooled connections to each replica. Default 1024.
	MaxConnsPerReplica int `mapstructure:"max_conns_per_replica"`
	// ConnWait is how long a request waits for a free connection to a
	// replica whose pool (max_conns_per_replica) is full, after trying the
	// replicas that have one; then it gets 503 with Retry-After. A full
	// pool never counts as the replica's failure. Default 1s.
	ConnWait time.Duration `mapstructure:"conn_wait"`
	// MaxURLBytes is the longest request target in bytes; longer gets 414. Default 8192.
	MaxURLBytes int `mapstructure:"max_url_bytes"`
	// MaxHeaderBytes bounds the request line and headers in bytes; larger
	// gets 431. Default 32768.
	MaxHeaderBytes int `mapstructure:"max_header_bytes"`
	// MaxConnections caps concurrent client connections (TLS or not); a
	// connection over the cap gets a 503 OpenAI error with Retry-After and
	// is closed, logged and counted like any answer. Default 10000.
	MaxConnections int `mapstructure:"max_connections"`
	// MaxInflight caps concurrent requests being proxied; above it clients
	// get 503 with Retry-After. Default 4096.
	MaxInflight int `mapstructure:"max_inflight"`
	// MaxBufferedResponseBytes is the largest answer of known length, in
	// bytes, read whole from a replica before it is sent to the client;
	// a larger one, like every stream, is relayed as it arrives. In a
	// disaggregated fleet it also bounds a decode answer the client did
	// not ask to stream, which is read whole (a larger one: 502). Default
	// 1048576 (1 MiB).
	MaxBufferedResponseBytes int `mapstructure:"max_buffered_response_bytes"`
}

// Auth guards the listeners.
type Auth struct {
	// APIKeys lists the only bearer tokens the proxy accepts, when not
	// empty (compared in constant time; 401 otherwise); the client's
	// Authorization header is then not forwarded. Default empty: Authorization
	// passes through untouched.
	APIKeys []string `mapstructure:"api_keys"`
	// AdminToken is the bearer token the admin listener requires (except
	// /healthz and /readyz). Default empty: no token.
	AdminToken string `mapstructure:"admin_token"`
}

// Timeouts of the forwarding path.
type Timeouts struct {
	// Connect is the dial timeout to a replica. Default 2s.
	Connect time.Duration `mapstructure:"connect"`
	// FirstByte is the longest wait for a replica's response headers. Default 120s.
	FirstByte time.Duration `mapstructure:"first_byte"`
	// StreamIdle is the longest silence between streamed chunks; an event
	// stream relayed by the socket poller (plain TCP on both sides) is cut
	// within 1.25 times it. Default 60s.
	StreamIdle time.Duration `mapstructure:"stream_idle"`
	// ClientHeader is the longest a client may take to send request headers. Default 10s.
	ClientHeader time.Duration `mapstructure:"client_header"`
	// ClientWrite is the longest a client may take to accept bytes of its
	// answer; past it the request ends and its replica connection is
	// closed. Default 30s.
	ClientWrite time.Duration `mapstructure:"client_write"`
	// ClientIdle is how long a kept-alive client connection may wait for
	// its next request before kvroute closes it. Default 60s.
	ClientIdle time.Duration `mapstructure:"client_idle"`
	// Drain is how long shutdown waits for in-flight requests. Default 30s.
	Drain time.Duration `mapstructure:"drain"`
	// DrainDelay is how long, after SIGTERM, new connections are still
	// accepted while /readyz already answers 503, so that load balancers
	// and Kubernetes endpoints stop sending first. Default 5s.
	DrainDelay time.Duration `mapstructure:"drain_delay"`
}

// Health configures active and passive health checking.
type Health struct {
	// Interval between GET /health checks of each replica. Default 2s.
	Interval time.Duration `mapstructure:"interval"`
	// Timeout of one check. Default 1s.
	Timeout time.Duration `mapstructure:"timeout"`
	// FailThreshold is the number of consecutive failed requests, or of consecutive failed
	// health checks (counted apart: a passing check does not end a streak of failed requests),
	// that ejects a replica. Default 3.
	FailThreshold int `mapstructure:"fail_threshold"`
}

// Metrics configures /metrics polling.
type Metrics struct {
	// Interval between polls of each replica's /metrics. Default 250ms.
	Interval time.Duration `mapstructure:"interval"`
	// Timeout of one poll. Default 1s.
	Timeout time.Duration `mapstructure:"timeout"`
}

// Tokenizer configures routing keys.
type Tokenizer struct {
	// Encoding is the tokenizer of routing keys: cl100k_base or o200k_base.
	// Default cl100k_base.
	Encoding string `mapstructure:"encoding"`
	// CacheBytes bounds the token cache in bytes, shared by the tokens of
	// whole messages, of chunks of long texts and of conversations (the
	// key of each chat request, found again by its next turn).
	// Default 67108864 (64 MiB).
	CacheBytes int64 `mapstructure:"cache_bytes"`
}

// LegacyCacheAware is the cache_aware section of earlier releases, read
// as the sections that replaced it (deprecated.go). Its keys have no
// defaults of their own.
type LegacyCacheAware struct {
	// Lambda is Deprecated: policies.cache_aware.lambda.
	Lambda float64 `mapstructure:"lambda"`
	// Mu is Deprecated: policies.cache_aware.mu.
	Mu float64 `mapstructure:"mu"`
	// Nu is Deprecated: policies.cache_aware.nu.
	Nu float64 `mapstructure:"nu"`
	// Epsilon is Deprecated: policies.cache_aware.epsilon.
	Epsilon float64 `mapstructure:"epsilon"`
	// BoundFloor is Deprecated: policies.cache_aware.bound_floor.
	BoundFloor int `mapstructure:"bound_floor"`
	// MinMatchTokens is Deprecated: policies.cache_aware.min_match_tokens.
	MinMatchTokens int `mapstructure:"min_match_tokens"`
	// BranchBalance is Deprecated: policies.cache_aware.branch_balance.
	BranchBalance float64 `mapstructure:"branch_balance"`
	// TurnPrice is Deprecated: policies.cache_aware.turn_price.
	TurnPrice float64 `mapstructure:"turn_price"`
	// TTL is Deprecated: index.ttl.
	TTL time.Duration `mapstructure:"ttl"`
	// BlockSize is Deprecated: index.block_size.
	BlockSize int `mapstructure:"block_size"`
	// DefaultBudgetTokens is Deprecated: index.default_budget_tokens.
	DefaultBudgetTokens int64 `mapstructure:"default_budget_tokens"`
	// TreeMaxBytes is Deprecated: index.tree_max_bytes.
	TreeMaxBytes int64 `mapstructure:"tree_max_bytes"`
}

// Index sizes the fleet's cache state, which every policy that routes by
// prefix reads.
type Index struct {
	// TTL after which a tree entry no longer counts; it is also the
	// half-life of each replica's recent prefill work. Default 10m.
	TTL time.Duration `mapstructure:"ttl"`
	// BlockSize is the engine block size in tokens when metrics don't say,
	// and the granularity of routing keys: the router tracks prompts in
	// blocks of this many tokens (one key value per whole block), as the
	// engines cache them. Needs a restart as the routing keys' block.
	// Default 16.
	BlockSize int `mapstructure:"block_size"`
	// DefaultBudgetTokens is the KV capacity assumed, in tokens, for a
	// replica whose capacity is unknown: its share of the tree holds about
	// that much. Default 400000.
	DefaultBudgetTokens int64 `mapstructure:"default_budget_tokens"`
	// TreeMaxBytes caps the whole tree's memory in bytes. Needs a restart.
	// Default 268435456 (256 MiB).
	TreeMaxBytes int64 `mapstructure:"tree_max_bytes"`
}

// Session configures session affinity.
type Session struct {
	// Header carrying a session ID. Default X-Session-ID. The OpenAI "user"
	// field stands in when the header is absent.
	Header string `mapstructure:"header"`
	// TTL of a session's binding to a replica. Default 30m.
	TTL time.Duration `mapstructure:"ttl"`
	// MaxEntries bounds the session bindings held; beyond it the least
	// recently used goes. Each costs at most 160 bytes (IDs are kept as
	// 128-bit digests). Default 100000.
	MaxEntries int `mapstructure:"max_entries"`
	// MaxIDBytes is the longest session ID in bytes; a longer one is routed
	// as no session and counted (kvroute_session_ids_rejected_total).
	// Default 256.
	MaxIDBytes int `mapstructure:"max_id_bytes"`
	// DeprecatedEpsilon is Deprecated: policies.session.epsilon. Nothing
	// reads this field.
	DeprecatedEpsilon float64 `mapstructure:"epsilon"`
}

// Log configures logging.
type Log struct {
	// Level is the lowest level logged: debug, info, warn or error.
	// Default info.
	Level string `mapstructure:"level"`
	// Format is the log lines' encoding: json or console. Default json.
	Format string `mapstructure:"format"`
	// FlushInterval is the longest a log line waits in memory before it
	// is written: lines are gathered (up to 64 KiB) and written together,
	// one system call for many access lines instead of one each, and a
	// line of level warn or above is written at once with those before
	// it. A crash loses at most this much of the log; a stop writes it
	// all. 0 writes every line as it comes. Default 200ms.
	FlushInterval time.Duration `mapstructure:"flush_interval"`
}

// MinBodyBufferBytes is the least limits.max_body_buffer_bytes that lets
// one request body of maxBody bytes be read alone: the proxy's body
// buffers are powers of two from 4 KiB, and a body past the 8 KiB read
// before the handler runs holds, while its buffer grows, the buffer of
// the power of two at or above maxBody and the half-size one it is copied
// from.
func MinBodyBufferBytes(maxBody int) int64 {
	c := int64(4 << 10)
	for c < int64(maxBody) {
		c <<= 1
	}
	if maxBody > 8<<10 {
		return c + c/2
	}
	return c
}

// Defaults returns the configuration every unset field falls back to. A
// duration is text with its unit ("0s" for zero).
func Defaults() map[string]any {
	d := map[string]any{
		"listen":                                   "127.0.0.1:8080",
		"admin_listen":                             "127.0.0.1:9090",
		"policy":                                   "cache_aware",
		"limits.max_body_bytes":                    8 << 20,
		"limits.max_body_buffer_bytes":             256 << 20,
		"limits.max_conns_per_replica":             1024,
		"limits.conn_wait":                         "1s",
		"limits.max_url_bytes":                     8192,
		"limits.max_header_bytes":                  32768,
		"limits.max_connections":                   10000,
		"limits.max_inflight":                      4096,
		"limits.max_buffered_response_bytes":       1 << 20,
		"auth.api_keys":                            []string{},
		"auth.admin_token":                         "",
		"retries":                                  1,
		"timeouts.connect":                         "2s",
		"timeouts.first_byte":                      "120s",
		"timeouts.stream_idle":                     "60s",
		"timeouts.client_header":                   "10s",
		"timeouts.client_write":                    "30s",
		"timeouts.client_idle":                     "60s",
		"timeouts.drain":                           "30s",
		"timeouts.drain_delay":                     "5s",
		"tls.cert_file":                            "",
		"tls.key_file":                             "",
		"tls.min_version":                          defaultTLSVersion,
		"admin_tls.cert_file":                      "",
		"admin_tls.key_file":                       "",
		"admin_tls.min_version":                    defaultTLSVersion,
		"upstream_tls.ca_file":                     "",
		"upstream_tls.cert_file":                   "",
		"upstream_tls.key_file":                    "",
		"upstream_tls.server_name":                 "",
		"upstream_tls.insecure_skip_verify":        false,
		"expose_backend_names":                     true,
		"expose_route_reason":                      false,
		"responses.ttl":                            "1h",
		"responses.max_entries":                    100000,
		"health.interval":                          "2s",
		"health.timeout":                           "1s",
		"health.fail_threshold":                    3,
		"metrics.interval":                         "250ms",
		"metrics.timeout":                          "1s",
		"tokenizer.encoding":                       "cl100k_base",
		"tokenizer.cache_bytes":                    64 << 20,
		"index.ttl":                                "10m",
		"index.block_size":                         16,
		"index.default_budget_tokens":              400000,
		"index.tree_max_bytes":                     256 << 20,
		"session.header":                           "X-Session-ID",
		"cache_salt.from":                          "",
		"cache_salt.key":                           "",
		"flow.max_waiting":                         0,
		"flow.max_running":                         0,
		"flow.max_kv":                              0.0,
		"flow.locality_wait":                       time.Second.String(),
		"flow.max_queued":                          1000,
		"flow.max_queued_bytes":                    64 << 20,
		"flow.max_wait":                            (30 * time.Second).String(),
		"flow.priority_header":                     "",
		"flow.tenant":                              "",
		"flow.tenant_limits.rate":                  0.0,
		"flow.tenant_limits.burst":                 0,
		"flow.tenant_limits.nodelay":               false,
		"flow.tenant_limits.max_concurrent":        0,
		"flow.tenant_limits.tokens_per_minute":     0,
		"flow.tenant_limits.max_tenants":           10000,
		"disaggregation.protocol":                  "",
		"disaggregation.local_prefill_tokens":      0,
		"disaggregation.local_prefill_backlog":     0,
		"disaggregation.local_prefill_max_running": 0,
		"session.ttl":                              "30m",
		"session.max_entries":                      100000,
		"session.max_id_bytes":                     256,
		"discovery.interval":                       "10s",
		"log.level":                                "info",
		"log.format":                               "json",
		"log.flush_interval":                       "200ms",
	}
	maps.Copy(d, clusterDefaults())
	maps.Copy(d, preciseDefaults())
	policyDefaults(d)
	return d
}

// fieldError is one Validate error: the key (backends[1].url) and what is
// wrong with its value. Load adds where the value came from.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

// zeroMeans are the durations with a non-zero default where 0 means
// something of its own: no drain delay, no leader (a peer cluster), no
// check of a silent event stream.
var zeroMeans = map[string]bool{
	"timeouts.drain_delay":      true,
	"cluster.lead_timeout":      true,
	"precise.max_event_silence": true,
	"flow.locality_wait":        true,
}

// Validate checks every field and reports each bad one, naming its key and
// value, all joined.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &fieldError{field, fmt.Sprintf(format, args...)})
	}
	if err := checkAddr(c.Listen); err != nil {
		bad("listen", "%v", err)
	}
	if c.AdminListen != "" {
		if err := checkAddr(c.AdminListen); err != nil {
			bad("admin_listen", "%v", err)
		}
	}
	if _, ok := router.Lookup(c.Policy); !ok {
		bad("policy", "unknown policy %q (want one of %s)", c.Policy, strings.Join(router.Names(), ", "))
	}
	if len(c.Backends) == 0 {
		bad("backends", "at least one backend is required")
	}
	seen := map[string]bool{}
	split := false // some backend is a prefill or decode replica
	for i, b := range c.Backends {
		f := fmt.Sprintf("backends[%d]", i)
		switch {
		case b.Name == "":
			bad(f+".name", "is required")
		case seen[b.Name]:
			bad(f+".name", "duplicate name %q", b.Name)
		}
		seen[b.Name] = true
		if err := checkURL(b.URL); err != nil {
			bad(f+".url", "%v", err)
		}
		if b.Engine != "" && b.Engine != "vllm" && b.Engine != "sglang" {
			bad(f+".engine", "unknown engine %q (want vllm or sglang)", b.Engine)
		}
		if b.CacheTokens < 0 {
			bad(f+".cache_tokens", "must be 0 (from metrics) or positive, got %d", b.CacheTokens)
		}
		if b.Weight < 0 || math.IsNaN(b.Weight) || math.IsInf(b.Weight, 0) {
			bad(f+".weight", "must be positive (default 1), got %v", b.Weight)
		}
		if b.UpstreamTLS != nil {
			checkUpstreamTLS(f+".upstream_tls", c.UpstreamTLS.Merge(b.UpstreamTLS), bad)
		}
		if b.DataParallelSize < 0 || b.DataParallelSize > backends.MaxDataParallelSize {
			bad(f+".data_parallel_size", "must be 1..%d (0 means 1), got %d", backends.MaxDataParallelSize, b.DataParallelSize)
		}
		switch backends.Role(b.Role) {
		case "", backends.RoleBoth:
		case backends.RolePrefill, backends.RoleDecode:
			split = true
		default:
			bad(f+".role", "unknown role %q (want prefill, decode or both)", b.Role)
		}
		if b.BootstrapPort < 0 || b.BootstrapPort > 65535 {
			bad(f+".bootstrap_port", "must be 1..65535 (0 means %d), got %d", backends.DefaultBootstrapPort, b.BootstrapPort)
		}
	}
	checkDisaggregation(c, split, bad)
	checkFlow(&c.Flow, bad)
	if c.Flow.Queues() && c.Flow.MaxQueued >= c.Limits.MaxInflight && c.Limits.MaxInflight > 0 {
		// Past max_inflight every tenant is refused alike, and the
		// queue's shedding by priority and share never runs.
		bad("flow.max_queued", "must be below limits.max_inflight (%d), which counts queued requests too, with room left for those being served; got %d",
			c.Limits.MaxInflight, c.Flow.MaxQueued)
	}
	checkCacheSalt(&c.CacheSalt, bad)
	positive := []struct {
		name string
		v    int64
	}{
		{"limits.max_body_bytes", int64(c.Limits.MaxBodyBytes)},
		{"limits.max_body_buffer_bytes", int64(c.Limits.MaxBodyBufferBytes)},
		{"limits.max_conns_per_replica", int64(c.Limits.MaxConnsPerReplica)},
		{"limits.max_url_bytes", int64(c.Limits.MaxURLBytes)},
		{"limits.max_header_bytes", int64(c.Limits.MaxHeaderBytes)},
		{"limits.max_connections", int64(c.Limits.MaxConnections)},
		{"limits.max_inflight", int64(c.Limits.MaxInflight)},
		{"limits.max_buffered_response_bytes", int64(c.Limits.MaxBufferedResponseBytes)},
		{"health.fail_threshold", int64(c.Health.FailThreshold)},
		{"tokenizer.cache_bytes", c.Tokenizer.CacheBytes},
		{"index.block_size", int64(c.Index.BlockSize)},
		{"index.default_budget_tokens", c.Index.DefaultBudgetTokens},
		{"index.tree_max_bytes", c.Index.TreeMaxBytes},
		{"responses.max_entries", int64(c.Responses.MaxEntries)},
	}
	for _, p := range positive {
		if p.v <= 0 {
			bad(p.name, "must be positive, got %d", p.v)
		}
	}
	// Every duration (found by reflection, so new ones are covered) must be
	// positive, except those where zero means something (zeroMeans) and any
	// whose default is zero.
	dflt := Defaults()
	for _, d := range durations(reflect.ValueOf(c).Elem(), configSchema(), "") {
		mayBeZero := zeroMeans[d.name] || dflt[d.name] == "0s"
		switch {
		case d.v < 0 && mayBeZero:
			bad(d.name, "must not be negative, got %v", d.v)
		case d.v <= 0 && !mayBeZero:
			bad(d.name, "must be a positive duration, got %v", d.v)
		}
	}
	checkListenerTLS("tls", c.TLS, bad)
	checkCluster(c.Cluster, bad)
	checkPrecise(c, bad)
	checkListenerTLS("admin_tls", c.AdminTLS, bad)
	checkUpstreamTLS("upstream_tls", c.UpstreamTLS, bad)
	if c.Retries < 0 || c.Retries > 10 {
		bad("retries", "must be between 0 and 10, got %d", c.Retries)
	}
	if c.Tokenizer.Encoding != "cl100k_base" && c.Tokenizer.Encoding != "o200k_base" {
		bad("tokenizer.encoding", "unknown encoding %q (want cl100k_base or o200k_base)", c.Tokenizer.Encoding)
	}
	checkPolicies(c, bad)
	if c.Limits.MaxHeaderBytes > 0 && c.Limits.MaxURLBytes > c.Limits.MaxHeaderBytes {
		bad("limits.max_url_bytes", "%d exceeds limits.max_header_bytes (%d)", c.Limits.MaxURLBytes, c.Limits.MaxHeaderBytes)
	}
	if need := MinBodyBufferBytes(c.Limits.MaxBodyBytes); c.Limits.MaxBodyBytes > 0 && c.Limits.MaxBodyBufferBytes > 0 && int64(c.Limits.MaxBodyBufferBytes) < need {
		bad("limits.max_body_buffer_bytes", "%d is less than the %d one body of limits.max_body_bytes (%d) may hold while it is read",
			c.Limits.MaxBodyBufferBytes, need, c.Limits.MaxBodyBytes)
	}
	for i, k := range c.Auth.APIKeys {
		if len(k) < 8 {
			bad(fmt.Sprintf("auth.api_keys[%d]", i), "too short (%d characters): use at least 8", len(k))
		}
	}
	if c.Session.Header == "" {
		bad("session.header", "must not be empty")
	}
	if c.Session.MaxEntries < 1 {
		bad("session.max_entries", "must be at least 1, got %d", c.Session.MaxEntries)
	}
	if c.Session.MaxIDBytes < 1 {
		bad("session.max_id_bytes", "must be at least 1, got %d", c.Session.MaxIDBytes)
	}
	if !contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		bad("log.level", "unknown level %q (want debug, info, warn or error)", c.Log.Level)
	}
	if c.Log.Format != "json" && c.Log.Format != "console" {
		bad("log.format", "unknown format %q (want json or console)", c.Log.Format)
	}
	if c.Log.FlushInterval < 0 {
		bad("log.flush_interval", "must not be negative, got %s", c.Log.FlushInterval)
	}
	return errors.Join(errs...)
}

type namedDuration struct {
	name string
	v    time.Duration
}

// durations lists every time.Duration field in v (a struct of schema s),
// nested sections included, by key.
func durations(v reflect.Value, s *schema, prefix string) []namedDuration {
	var out []namedDuration
	for _, f := range s.fields {
		name := joinPath(prefix, f.key)
		fv := f.value(v)
		switch {
		case !fv.IsValid() || deprecated(name):
		case f.typ == durationType:
			out = append(out, namedDuration{name, time.Duration(fv.Int())})
		case f.kind == structField:
			out = append(out, durations(fv, f.sub, name)...)
		}
	}
	return out
}

// defaultTLSVersion is min_version's default, for both listeners.
const defaultTLSVersion = "1.2"

// TLSVersions maps the accepted min_version values to crypto/tls versions.
var TLSVersions = map[string]uint16{defaultTLSVersion: 0x0303, "1.3": 0x0304}

func checkListenerTLS(field string, t ListenerTLS, bad func(field, format string, args ...any)) {
	if _, ok := TLSVersions[t.MinVersion]; !ok {
		bad(field+".min_version", "unknown TLS version %q (want 1.2 or 1.3)", t.MinVersion)
	}
	checkPair(field, t.CertFile, t.KeyFile, bad)
}

func checkUpstreamTLS(field string, t UpstreamTLS, bad func(field, format string, args ...any)) {
	checkPair(field, t.CertFile, t.KeyFile, bad)
}

// checkPair reports a certificate without its key or a key without its
// certificate, on the one that is set.
func checkPair(field, cert, key string, bad func(field, format string, args ...any)) {
	switch {
	case cert != "" && key == "":
		bad(field+".cert_file", "%q is set but %s.key_file is empty; set both or neither", cert, field)
	case key != "" && cert == "":
		bad(field+".key_file", "%q is set but %s.cert_file is empty; set both or neither", key, field)
	}
}

func checkAddr(addr string) error {
	if addr == "" {
		return errors.New("is empty; want host:port")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	return nil
}

func checkURL(raw string) error {
	if raw == "" {
		return errors.New("is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q does not parse: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be http or https", raw)
	}
	if u.Host == "" || u.Port() == "" && u.Hostname() == "" {
		return fmt.Errorf("%q: host is missing", raw)
	}
	// A path is the replica's base path, prefixed to every forwarded path.
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q: a base URL has no query, fragment or credentials", raw)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
