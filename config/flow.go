package config

import (
	"math"
	"strings"
	"time"
)

// Flow configures flow control at the gateway: limits per tenant, and a
// queue in kvroute that holds requests while every replica that could
// serve them is saturated, dispatching them as capacity frees (each is
// routed then, with the cache and load of the moment). Off by default:
// with none of max_waiting, max_running and max_kv set nothing is queued, and with no
// tenant limit set nothing is limited.
type Flow struct {
	// MaxWaiting makes a replica saturated while its engine's waiting
	// requests (vllm:num_requests_waiting, sglang:num_queue_reqs, at the
	// last metrics poll, plus the growth since then of kvroute's requests
	// in flight to it) reach this count. 0: not by its queue. Default 0.
	MaxWaiting int `mapstructure:"max_waiting"`
	// MaxRunning makes a replica saturated while its engine's requests,
	// running and waiting (vllm:num_requests_running and
	// vllm:num_requests_waiting, or SGLang's, at the last metrics poll,
	// plus the change since then of kvroute's requests in flight to it),
	// reach this count: it bounds the engine's batch, whose size slows
	// every request in it. A tenant holding less than its fair share of
	// the fleet (max_running × the replicas, divided by the tenants with
	// requests in flight or queued) is not held back by it, so that
	// another tenant's flood cannot keep it waiting for a place in the
	// batches; one at or over its share while others are active also
	// waits, with the cache_aware policy, while a prompt sent to the
	// replica is still prefilling (no first byte back), so that its
	// prompts do not slow the others' in the same engine step, and does
	// not take the last replica with nothing prefilling while a tenant
	// under its share is active; that tenant's requests go first to a
	// replica with nothing prefilling (unless one prefilling holds 512
	// more tokens of the prompt), and past other tenants' queued
	// requests. A tenant stays active for a second after its last
	// request. 0: not by the batch. Default 0.
	MaxRunning int `mapstructure:"max_running"`
	// MaxKV makes a replica saturated while its engine's KV cache usage
	// (a fraction, 0 to 1) reaches this. 0: not by KV usage. Default 0.
	MaxKV float64 `mapstructure:"max_kv"`
	// LocalityWait is how long a queued request whose prefix a saturated
	// replica holds (at least 512 tokens of it, more than twice what any
	// replica with room holds) lets younger requests take the room that
	// frees elsewhere, waiting for its holder to free up: late binding
	// that keeps a conversation where its cache is. 0: every request
	// takes the first room. Default 1s.
	LocalityWait time.Duration `mapstructure:"locality_wait"`
	// MaxQueued bounds the requests waiting in kvroute at once; past it
	// the least urgent are shed (429), then, among equally urgent ones,
	// the newest of the tenant with the most waiting while it has more
	// than the newcomer's; else the newcomer is refused (503). Queued
	// requests count towards limits.max_inflight, which must be larger.
	// Default 1000.
	MaxQueued int `mapstructure:"max_queued"`
	// MaxQueuedBytes bounds the request bodies waiting in kvroute at once,
	// in bytes, as max_queued does their count. Default 67108864 (64 MiB).
	MaxQueuedBytes int64 `mapstructure:"max_queued_bytes"`
	// MaxWait is the longest a request waits in kvroute's queue before it
	// is answered 503 with Retry-After. Default 30s.
	MaxWait time.Duration `mapstructure:"max_wait"`
	// PriorityHeader names a request header holding the request's
	// priority, an integer; lower is served first (as vLLM's priority
	// field, which is honoured when the header is absent). Requests
	// without either have priority 0. Empty: none. Default empty.
	PriorityHeader string `mapstructure:"priority_header"`
	// Tenant says who a request's tenant is, for fairness in the queue
	// and the tenant limits: header:<Name> (that header's value),
	// api_key (a digest of the API key the client sent), or user (the
	// request's user field). Requests without one share one tenant.
	// Empty: every request is of one tenant. Default empty.
	Tenant string `mapstructure:"tenant"`
	// TenantLimits hold each tenant to a rate, a concurrency and a token
	// budget; a request past one is answered 429 with Retry-After and the
	// limit named. In a cluster each instance enforces its share (the
	// limits divided by the instances alive).
	TenantLimits TenantLimits `mapstructure:"tenant_limits"`
}

// TenantLimits are the limits each tenant is held to (flow.tenant_limits).
type TenantLimits struct {
	// Rate is the requests per second a tenant may send, as nginx's
	// limit_req rate. 0: no limit. Default 0.
	Rate float64 `mapstructure:"rate"`
	// Burst is how many requests above Rate are delayed to keep to it (or
	// with nodelay served at once) before any is refused, as nginx's
	// limit_req burst. Default 0.
	Burst int `mapstructure:"burst"`
	// NoDelay serves the requests within Burst at once rather than spaced
	// out at Rate, as nginx's nodelay. Default false.
	NoDelay bool `mapstructure:"nodelay"`
	// MaxConcurrent is the requests a tenant may have in flight at once,
	// as nginx's limit_conn. 0: no limit. Default 0.
	MaxConcurrent int `mapstructure:"max_concurrent"`
	// TokensPerMinute is the prompt tokens a tenant may send per minute
	// (counted as kvroute tokenizes them, or a quarter of the body's
	// bytes when it does not). 0: no limit. Default 0.
	TokensPerMinute int `mapstructure:"tokens_per_minute"`
	// MaxTenants bounds the tenants whose limit state is kept at once;
	// past it, the idle longest are forgotten. Default 10000.
	MaxTenants int `mapstructure:"max_tenants"`
}

// Tenant sources (flow.tenant).
const (
	TenantHeaderPrefix = "header:"
	TenantAPIKey       = "api_key"
	TenantUser         = "user"
)

// TenantHeader returns the header name of a header:<Name> tenant source,
// and whether the source is one ("" and false for any other).
func (f *Flow) TenantHeader() (string, bool) { return TenantSourceHeader(f.Tenant) }

// Queues reports whether saturation is measured, so that requests may
// wait in kvroute's queue.
func (f *Flow) Queues() bool { return f.MaxWaiting > 0 || f.MaxRunning > 0 || f.MaxKV > 0 }

// checkFlow validates the flow section.
func checkFlow(f *Flow, bad func(field, format string, args ...any)) {
	l := f.TenantLimits
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"flow.max_waiting", int64(f.MaxWaiting)},
		{"flow.max_running", int64(f.MaxRunning)},
		{"flow.max_queued", int64(f.MaxQueued)},
		{"flow.max_queued_bytes", f.MaxQueuedBytes},
		{"flow.tenant_limits.burst", int64(l.Burst)},
		{"flow.tenant_limits.max_concurrent", int64(l.MaxConcurrent)},
		{"flow.tenant_limits.tokens_per_minute", int64(l.TokensPerMinute)},
	} {
		if c.v < 0 {
			bad(c.name, "must be 0 or positive, got %d", c.v)
		}
	}
	if f.MaxWait < 0 {
		bad("flow.max_wait", "must be 0 or positive, got %v", f.MaxWait)
	}
	if f.MaxKV < 0 || f.MaxKV > 1 || math.IsNaN(f.MaxKV) {
		bad("flow.max_kv", "must be a fraction from 0 (off) to 1, got %v", f.MaxKV)
	}
	if f.PriorityHeader != "" && !validHeaderName(f.PriorityHeader) {
		bad("flow.priority_header", "%q is not a header name", f.PriorityHeader)
	}
	checkTenantSource("flow.tenant", f.Tenant, bad)
	if l.Rate < 0 || math.IsNaN(l.Rate) || math.IsInf(l.Rate, 0) {
		bad("flow.tenant_limits.rate", "must be 0 (off) or positive, got %v", l.Rate)
	}
	if l.MaxTenants < 1 {
		bad("flow.tenant_limits.max_tenants", "must be positive, got %d", l.MaxTenants)
	}
}

// validHeaderName reports whether name is an HTTP field name: an RFC 9110
// token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}
