package config

import (
	"fmt"

	"github.com/kvroute/kvroute/backends"
)

// Disaggregation protocols (disaggregation.protocol).
const (
	ProtocolVLLM   = "vllm"
	ProtocolSGLang = "sglang"
)

// CheckProtocol checks a disaggregation protocol: vllm, sglang, or ""
// (none).
func CheckProtocol(p string) error {
	switch p {
	case "", ProtocolVLLM, ProtocolSGLang:
		return nil
	}
	return fmt.Errorf("unknown protocol %q (want %s or %s)", p, ProtocolVLLM, ProtocolSGLang)
}

// checkDisaggregation validates disaggregation.protocol against the
// backends' roles; split says some backend is a prefill or decode replica.
func checkDisaggregation(c *Config, split bool, bad func(field, format string, args ...any)) {
	if err := CheckProtocol(c.Disaggregation.Protocol); err != nil {
		bad("disaggregation.protocol", "%v", err)
		return
	}
	for _, lp := range []struct {
		key string
		n   int
	}{
		{"disaggregation.local_prefill_tokens", c.Disaggregation.LocalPrefillTokens},
		{"disaggregation.local_prefill_backlog", c.Disaggregation.LocalPrefillBacklog},
		{"disaggregation.local_prefill_max_running", c.Disaggregation.LocalPrefillMaxRunning},
	} {
		switch {
		case lp.n < 0:
			bad(lp.key, "must be 0 or more, got %d", lp.n)
		case lp.n > 0 && c.Disaggregation.Protocol != ProtocolVLLM:
			bad(lp.key, "needs protocol %s: an SGLang decode replica cannot run a request without its prefill", ProtocolVLLM)
		}
	}
	if d := c.Disaggregation; d.LocalPrefillMaxRunning > 0 && d.LocalPrefillBacklog == 0 {
		bad("disaggregation.local_prefill_max_running", "has no effect without disaggregation.local_prefill_backlog")
	}
	if !split {
		return
	}
	if c.Disaggregation.Protocol == "" {
		bad("disaggregation.protocol", "is required when a backend's role is prefill or decode (want %s or %s)", ProtocolVLLM, ProtocolSGLang)
	}
	prefill, decode := false, false
	for _, b := range c.Backends {
		switch backends.Role(b.Role) {
		case backends.RolePrefill:
			prefill = true
		case backends.RoleDecode:
			decode = true
		default:
			prefill, decode = true, true
		}
	}
	if !prefill {
		bad("backends", "a decode replica needs a prefill replica (role prefill or both) to pair with")
	}
	if !decode {
		bad("backends", "a prefill replica needs a decode replica (role decode or both) to pair with")
	}
}
