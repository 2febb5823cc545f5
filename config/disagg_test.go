package config

import (
	"fmt"
	"testing"
)

// Roles, bootstrap ports and disaggregation.protocol.
func TestDisaggregation(t *testing.T) {
	const two = "backends:\n  - name: p\n    url: http://127.0.0.1:8001\n    role: %s\n  - name: d\n    url: http://127.0.0.1:8002\n    role: %s\n"
	fleet := func(p, d string) string { return fmt.Sprintf(two, p, d) }
	cases := []struct {
		name, body, err string
		protocol        string
		roles           [2]string
		local, backlog  int
		maxRunning      int
	}{
		{name: "default", body: minimal, roles: [2]string{""}},
		{name: "vllm pair", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm}\n", protocol: "vllm", roles: [2]string{"prefill", "decode"}},
		{name: "sglang pair", body: fleet("prefill", "decode") + "disaggregation: {protocol: sglang}\n", protocol: "sglang", roles: [2]string{"prefill", "decode"}},
		{name: "mixed with both", body: fleet("both", "decode") + "disaggregation: {protocol: vllm}\n", protocol: "vllm", roles: [2]string{"both", "decode"}},
		{name: "protocol without roles", body: fleet("both", "both") + "disaggregation: {protocol: sglang}\n", protocol: "sglang", roles: [2]string{"both", "both"}},
		{name: "roles without protocol", body: fleet("prefill", "decode"), err: "disaggregation.protocol: is required when a backend's role is prefill or decode"},
		{name: "unknown protocol", body: fleet("prefill", "decode") + "disaggregation: {protocol: nixl}\n", err: `disaggregation.protocol: unknown protocol "nixl" (want vllm or sglang)`},
		{name: "unknown role", body: fleet("prefil", "decode") + "disaggregation: {protocol: vllm}\n", err: `backends[0].role: unknown role "prefil" (want prefill, decode or both)`},
		{name: "prefill alone", body: fleet("prefill", "prefill") + "disaggregation: {protocol: vllm}\n", err: "backends: a prefill replica needs a decode replica"},
		{name: "decode alone", body: fleet("decode", "decode") + "disaggregation: {protocol: vllm}\n", err: "backends: a decode replica needs a prefill replica"},
		{name: "local prefill", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_tokens: 1024}\n", protocol: "vllm", roles: [2]string{"prefill", "decode"}, local: 1024},
		{name: "local prefill with sglang", body: fleet("prefill", "decode") + "disaggregation: {protocol: sglang, local_prefill_tokens: 1024}\n", err: "disaggregation.local_prefill_tokens: needs protocol vllm"},
		{name: "negative local prefill", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_tokens: -1}\n", err: "disaggregation.local_prefill_tokens: must be 0 or more, got -1"},
		{name: "backlog", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_backlog: 65536}\n", protocol: "vllm", roles: [2]string{"prefill", "decode"}, backlog: 65536},
		{name: "backlog with sglang", body: fleet("prefill", "decode") + "disaggregation: {protocol: sglang, local_prefill_backlog: 65536}\n", err: "disaggregation.local_prefill_backlog: needs protocol vllm"},
		{name: "max running", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_backlog: 1, local_prefill_max_running: 2}\n", protocol: "vllm", roles: [2]string{"prefill", "decode"}, backlog: 1, maxRunning: 2},
		{name: "negative max running", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_max_running: -1}\n", err: "disaggregation.local_prefill_max_running: must be 0 or more, got -1"},
		{name: "max running alone", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_max_running: 2}\n", err: "disaggregation.local_prefill_max_running: has no effect without disaggregation.local_prefill_backlog"},
		{name: "negative backlog", body: fleet("prefill", "decode") + "disaggregation: {protocol: vllm, local_prefill_backlog: -5}\n", err: "disaggregation.local_prefill_backlog: must be 0 or more, got -5"},
		{name: "bootstrap port", body: minimal + "    bootstrap_port: 9000\n", roles: [2]string{""}},
		{name: "bad bootstrap port", body: minimal + "    bootstrap_port: 70000\n", err: "backends[0].bootstrap_port: must be 1..65535 (0 means 8998), got 70000"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, nil, c.err)
			if cfg == nil {
				return
			}
			if cfg.Disaggregation.Protocol != c.protocol {
				t.Errorf("protocol %q, want %q", cfg.Disaggregation.Protocol, c.protocol)
			}
			if d := cfg.Disaggregation; d.LocalPrefillTokens != c.local || d.LocalPrefillBacklog != c.backlog || d.LocalPrefillMaxRunning != c.maxRunning {
				t.Errorf("local_prefill_tokens %d, local_prefill_backlog %d, local_prefill_max_running %d, want %d, %d and %d",
					d.LocalPrefillTokens, d.LocalPrefillBacklog, d.LocalPrefillMaxRunning, c.local, c.backlog, c.maxRunning)
			}
			for i, b := range cfg.Backends {
				if b.Role != c.roles[i] {
					t.Errorf("backends[%d].role %q, want %q", i, b.Role, c.roles[i])
				}
			}
		})
	}
}
