package config

import "testing"

// precise.max_event_bytes: 16 MiB by default, positive when set.
func TestPreciseMaxEventBytes(t *testing.T) {
	cases := []struct {
		name, body string
		want       int64
		err        string
	}{
		{name: "default", body: minimal, want: 16 << 20},
		{name: "set", body: minimal + "precise: {max_event_bytes: 1048576}\n", want: 1 << 20},
		{name: "zero", body: minimal + "precise: {max_event_bytes: 0}\n", err: "precise.max_event_bytes: must be positive, got 0"},
		{name: "negative", body: minimal + "precise: {max_event_bytes: -1}\n", err: "precise.max_event_bytes: must be positive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := loadCase(t, c.body, nil, c.err)
			if cfg != nil && cfg.Precise.MaxEventBytes != c.want {
				t.Errorf("max_event_bytes %d, want %d", cfg.Precise.MaxEventBytes, c.want)
			}
		})
	}
}
