package config

import "testing"

// The flow section: defaults off, each bad value named by its key.
func TestFlow(t *testing.T) {
	cases := []struct {
		name, body, err string
		queues          bool
		header          string
	}{
		{name: "default: off", body: minimal},
		{name: "queue by waiting, tenant by header", body: minimal + "flow: {max_waiting: 4, tenant: \"header:X-Tenant\"}\n", queues: true, header: "X-Tenant"},
		{name: "queue by kv", body: minimal + "flow: {max_kv: 0.9, tenant: api_key}\n", queues: true},
		{name: "negative waiting", body: minimal + "flow: {max_waiting: -1}\n", err: "flow.max_waiting: must be 0 or positive, got -1"},
		{name: "kv past 1", body: minimal + "flow: {max_kv: 1.5}\n", err: "flow.max_kv: must be a fraction from 0 (off) to 1, got 1.5"},
		{name: "negative wait", body: minimal + "flow: {max_wait: -1s}\n", err: "flow.max_wait: must be 0 or positive, got -1s"},
		{name: "bad priority header", body: minimal + "flow: {priority_header: \"X Priority\"}\n", err: `flow.priority_header: "X Priority" is not a header name`},
		{name: "bad tenant header", body: minimal + "flow: {tenant: \"header:\"}\n", err: `flow.tenant: "" is not a header name (want header:<Name>)`},
		{name: "unknown tenant source", body: minimal + "flow: {tenant: ip}\n", err: `flow.tenant: unknown tenant source "ip" (want header:<Name>, api_key or user)`},
		{name: "negative rate", body: minimal + "flow: {tenant_limits: {rate: -2}}\n", err: "flow.tenant_limits.rate: must be 0 (off) or positive, got -2"},
		{name: "negative concurrency", body: minimal + "flow: {tenant_limits: {max_concurrent: -3}}\n", err: "flow.tenant_limits.max_concurrent: must be 0 or positive, got -3"},
		{name: "queue as long as the in-flight cap", body: minimal + "flow: {max_running: 8, max_queued: 4096}\n",
			err: "flow.max_queued: must be below limits.max_inflight (4096), which counts queued requests too, with room left for those being served; got 4096"},
		{name: "no tenants", body: minimal + "flow: {tenant_limits: {max_tenants: 0}}\n", err: "flow.tenant_limits.max_tenants: must be positive, got 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, nil, c.err)
			if cfg == nil {
				return
			}
			if cfg.Flow.Queues() != c.queues {
				t.Errorf("queues %v, want %v", cfg.Flow.Queues(), c.queues)
			}
			if h, _ := cfg.Flow.TenantHeader(); h != c.header {
				t.Errorf("tenant header %q, want %q", h, c.header)
			}
			if cfg.Flow.MaxQueued != 1000 || cfg.Flow.TenantLimits.MaxTenants != 10000 {
				t.Errorf("defaults max_queued %d, max_tenants %d", cfg.Flow.MaxQueued, cfg.Flow.TenantLimits.MaxTenants)
			}
		})
	}
}
