package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"time"
)

// KVEvents is where a replica's engine publishes its KV cache events
// (vLLM --kv-events-config, SGLang --kv-events-config). A replica with it
// is routed in precise mode (see Precise) while its stream is live.
type KVEvents struct {
	// Endpoint is the engine's ZMQ publisher, tcp://host:port, which
	// kvroute dials; a host of "*" (as the engine binds it) or none means
	// the replica's own host. Required, unless listen is set.
	Endpoint string `mapstructure:"endpoint"`
	// Listen is where kvroute listens, tcp://host:port, for the engine's
	// publisher to connect, in place of endpoint: vLLM connects when its
	// endpoint names a host ("tcp://kvroute-0:5557"), llm-d-inference-sim
	// always. A host of "*" or none listens on every address. One
	// publisher is followed at a time (the latest to connect); with
	// data_parallel_size, rank r's on port + r. Several kvroute instances
	// each need their own publisher connection: have the engine bind
	// (endpoint) when running more than one. Default empty (kvroute dials
	// endpoint).
	Listen string `mapstructure:"listen"`
	// AllowFrom, with listen, is the addresses (IPs or CIDR prefixes) a
	// publisher may connect from; a connection from any other is closed
	// before a byte is read and counted in
	// kvroute_kv_events_rejected_total{reason="peer_refused"}. Default
	// empty: the addresses the replica's url host resolves to.
	AllowFrom []string `mapstructure:"allow_from"`
	// ReplayEndpoint is the engine's replay socket (vLLM replay_endpoint),
	// used to fill sequence gaps; the same host rule. Default empty: a gap
	// drops the replica's precise state, which then rebuilds from the
	// events that follow.
	ReplayEndpoint string `mapstructure:"replay_endpoint"`
	// Topic is the engine's event topic. Default empty (every message).
	Topic string `mapstructure:"topic"`
}

// Precise configures precise mode: the Index follows the engines' KV events
// (backends[].kv_events) and requests are keyed by the engine's own tokens,
// from its renderer.
type Precise struct {
	// RenderURL is the base URL of a vLLM replica or render process serving
	// POST /v1/chat/completions/render and /v1/completions/render (else
	// POST /tokenize). Default empty: precise mode off, whatever
	// kv_events say.
	RenderURL string `mapstructure:"render_url"`
	// RenderTimeout is how long a request waits for its render before it is
	// routed on the approximate key alone; the render goes on in the
	// background (for up to 2 s) and is kept for the conversation's next
	// turn. Default 20ms.
	RenderTimeout time.Duration `mapstructure:"render_timeout"`
	// RenderCacheBytes bounds, in bytes, the renders kept per conversation.
	// Default 33554432 (32 MiB).
	RenderCacheBytes int64 `mapstructure:"render_cache_bytes"`
	// PrefixTurns is how many next turns in a row must have rendered with
	// their previous turn's tokens as a prefix before a next turn is keyed
	// at once on its previous turn's render, its own render following in
	// the background; 0 keys every turn on its own render. Default 8.
	PrefixTurns int `mapstructure:"prefix_turns"`
	// MaxEventSilence is how long a replica's KV event stream may stay
	// silent, while requests are sent to it (16 since its last batch), before
	// the replica routes on approximate keys until its next batch: a stream
	// stopped without a gap. 0 turns the check off. Default 2s.
	MaxEventSilence time.Duration `mapstructure:"max_event_silence"`
	// MaxEventBytes bounds, in bytes, one KV-event message (all its
	// frames) from a replica's publisher or replay socket: a frame or
	// message declaring more closes that connection before it is read,
	// is counted in kvroute_kv_events_rejected_total, and the replica
	// routes on approximate keys until a batch arrives on a new
	// connection. Decoding a batch may take up to 4 times it. Default
	// 16777216 (16 MiB), about 50 times a batch of vLLM's largest
	// default scheduler step.
	MaxEventBytes int64 `mapstructure:"max_event_bytes"`
}

// Enabled reports whether precise mode is on.
func (p Precise) Enabled() bool { return p.RenderURL != "" }

func preciseDefaults() map[string]any {
	return map[string]any{
		"precise.render_url":         "",
		"precise.render_timeout":     "20ms",
		"precise.render_cache_bytes": 32 << 20,
		"precise.prefix_turns":       8,
		"precise.max_event_silence":  "2s",
		"precise.max_event_bytes":    16 << 20,
	}
}

// checkPrecise validates the precise section and the backends' kv_events.
func checkPrecise(c *Config, bad func(field, format string, args ...any)) {
	if c.Precise.RenderURL != "" {
		if err := checkURL(c.Precise.RenderURL); err != nil {
			bad("precise.render_url", "%v", err)
		}
	}
	if c.Precise.RenderCacheBytes <= 0 {
		bad("precise.render_cache_bytes", "must be positive, got %d", c.Precise.RenderCacheBytes)
	}
	if c.Precise.MaxEventBytes <= 0 {
		bad("precise.max_event_bytes", "must be positive, got %d", c.Precise.MaxEventBytes)
	}
	if c.Precise.PrefixTurns < 0 {
		bad("precise.prefix_turns", "must not be negative, got %d", c.Precise.PrefixTurns)
	}
	for i, b := range c.Backends {
		if b.KVEvents == nil {
			continue
		}
		f := "backends[" + strconv.Itoa(i) + "].kv_events"
		switch ev := b.KVEvents; {
		case ev.Listen != "" && ev.Endpoint != "":
			bad(f+".listen", "set either endpoint (kvroute dials the engine) or listen (the engine dials kvroute), not both")
		case ev.Listen != "":
			if err := checkZMQEndpoint(ev.Listen, b.DataParallelSize); err != nil {
				bad(f+".listen", "%v", err)
			}
		default:
			if err := checkZMQEndpoint(ev.Endpoint, b.DataParallelSize); err != nil {
				bad(f+".endpoint", "%v", err)
			}
		}
		if len(b.KVEvents.AllowFrom) > 0 && b.KVEvents.Listen == "" {
			bad(f+".allow_from", "applies only with listen")
		}
		for j, a := range b.KVEvents.AllowFrom {
			if _, err := ParsePeerPrefix(a); err != nil {
				bad(f+".allow_from["+strconv.Itoa(j)+"]", "%v", err)
			}
		}
		if b.KVEvents.ReplayEndpoint != "" {
			if err := checkZMQEndpoint(b.KVEvents.ReplayEndpoint, b.DataParallelSize); err != nil {
				bad(f+".replay_endpoint", "%v", err)
			}
		}
	}
}

// checkZMQEndpoint checks a tcp://host:port endpoint (host may be * or
// empty) whose port, raised by each of ranks data-parallel ranks but the
// first, stays a port.
func checkZMQEndpoint(s string, ranks int) error {
	if s == "" {
		return errors.New("is required (tcp://host:port)")
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "tcp" || u.Path != "" {
		return fmt.Errorf("%q is not tcp://host:port", s)
	}
	_, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return fmt.Errorf("%q is not tcp://host:port", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q has no valid port", s)
	}
	if ranks > 1 && n+ranks-1 > 65535 {
		return fmt.Errorf("%q: rank %d's port %d (port + rank) is past 65535", s, ranks-1, n+ranks-1)
	}
	return nil
}

// ParsePeerPrefix reads an allow_from entry: an IP address (the prefix of
// that address alone) or a CIDR prefix.
func ParsePeerPrefix(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is neither an IP address nor a CIDR prefix", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
