package config

import (
	"testing"
	"time"
)

// timeouts.client_write (default 30s) and limits.max_buffered_response_bytes
// (default 1 MiB) are read from the file and the environment; the first
// must be a positive duration, the second a positive number of bytes.
func TestClientWriteAndBufferedResponseBytes(t *testing.T) {
	cases := []struct {
		name, body string
		env        []string
		write      time.Duration
		buffered   int
		err        string
	}{
		{name: "default", body: minimal, write: 30 * time.Second, buffered: 1 << 20},
		{name: "file", body: minimal + "timeouts: {client_write: 250ms}\nlimits: {max_buffered_response_bytes: 65536}\n",
			write: 250 * time.Millisecond, buffered: 65536},
		{name: "environment", body: minimal,
			env:   []string{"KVROUTE_TIMEOUTS_CLIENT_WRITE=2m", "KVROUTE_LIMITS_MAX_BUFFERED_RESPONSE_BYTES=4096"},
			write: 2 * time.Minute, buffered: 4096},
		{name: "zero write", body: minimal + "timeouts: {client_write: 0s}\n", err: "timeouts.client_write: must be a positive duration"},
		{name: "negative write", body: minimal + "timeouts: {client_write: -1s}\n", err: "timeouts.client_write: must be a positive duration"},
		{name: "zero buffered", body: minimal + "limits: {max_buffered_response_bytes: 0}\n", err: "limits.max_buffered_response_bytes: must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, c.env, c.err)
			if cfg == nil {
				return
			}
			if cfg.Timeouts.ClientWrite != c.write || cfg.Limits.MaxBufferedResponseBytes != c.buffered {
				t.Errorf("client_write %v, max_buffered_response_bytes %d; want %v, %d",
					cfg.Timeouts.ClientWrite, cfg.Limits.MaxBufferedResponseBytes, c.write, c.buffered)
			}
		})
	}
	if d := Default(); d.Timeouts.ClientWrite != 30*time.Second || d.Limits.MaxBufferedResponseBytes != 1<<20 {
		t.Errorf("Default(): client_write %v, max_buffered_response_bytes %d", d.Timeouts.ClientWrite, d.Limits.MaxBufferedResponseBytes)
	}
}
