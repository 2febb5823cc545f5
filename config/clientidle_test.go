package config

import (
	"strings"
	"testing"
	"time"
)

// timeouts.client_idle defaults to 60s, is read from the file and the
// environment, and must be a positive duration.
func TestClientIdle(t *testing.T) {
	cases := []struct {
		name, body string
		env        []string
		want       time.Duration
		err        string
	}{
		{name: "default", body: minimal, want: 60 * time.Second},
		{name: "file", body: minimal + "timeouts: {client_idle: 300ms}\n", want: 300 * time.Millisecond},
		{name: "environment", body: minimal, env: []string{"KVROUTE_TIMEOUTS_CLIENT_IDLE=2m"}, want: 2 * time.Minute},
		{name: "zero", body: minimal + "timeouts: {client_idle: 0s}\n", err: "timeouts.client_idle: must be a positive duration"},
		{name: "negative", body: minimal + "timeouts: {client_idle: -1s}\n", err: "timeouts.client_idle: must be a positive duration"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, c.env, c.err)
			if cfg == nil {
				return
			}
			if cfg.Timeouts.ClientIdle != c.want {
				t.Errorf("client_idle %v, want %v", cfg.Timeouts.ClientIdle, c.want)
			}
		})
	}
	if d := Default().Timeouts.ClientIdle; d != 60*time.Second {
		t.Errorf("Default() client_idle %v", d)
	}
}

// loadCase loads body with env. With wantErr set it checks the load fails
// with an error containing it and returns nil; otherwise it returns the
// configuration.
func loadCase(t *testing.T, body string, env []string, wantErr string) *Config {
	t.Helper()
	cfg, err := LoadBytes("config.yaml", []byte(body), env, nil)
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error %v, want one containing %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
