package config

import "testing"

func TestCacheSalt(t *testing.T) {
	cases := []struct {
		name, body string
		env        []string
		err        string
		enabled    bool
	}{
		{name: "default: as sent", body: minimal},
		{name: "by API key", body: minimal + "cache_salt: {from: api_key, key: \"0123456789abcdef\"}\n", enabled: true},
		{name: "key from the environment", body: minimal + "cache_salt: {from: \"header:X-Tenant\"}\n", env: []string{"KVROUTE_CACHE_SALT_KEY=0123456789abcdefXYZ"}, enabled: true},
		{name: "short key", body: minimal + "cache_salt: {from: user, key: short}\n",
			err: "cache_salt.key: must be a secret of at least 16 bytes with cache_salt.from (the salts are derived from it), got 5"},
		{name: "no key", body: minimal + "cache_salt: {from: user}\n", err: "cache_salt.key: must be a secret of at least 16 bytes"},
		{name: "key alone", body: minimal + "cache_salt: {key: \"0123456789abcdef\"}\n", err: "cache_salt.key: is set but cache_salt.from is not"},
		{name: "unknown source", body: minimal + "cache_salt: {from: ip, key: \"0123456789abcdef\"}\n", err: `cache_salt.from: unknown tenant source "ip"`},
		{name: "bad header", body: minimal + "cache_salt: {from: \"header:A B\", key: \"0123456789abcdef\"}\n", err: `cache_salt.from: "A B" is not a header name`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, c.env, c.err)
			if cfg == nil {
				return
			}
			if cfg.CacheSalt.Enabled() != c.enabled {
				t.Errorf("enabled %v, want %v", cfg.CacheSalt.Enabled(), c.enabled)
			}
		})
	}
}
