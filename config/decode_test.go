package config

import (
	"slices"
	"strings"
	"testing"
)

// What a weakly typed decoder would read silently and differently is an
// error naming the value: a fraction or a boolean for a whole number, a
// number for a boolean, no value at all (which would mean the default), a
// YAML date for a string.
func TestDecodingRefusesSilentChanges(t *testing.T) {
	cases := []struct {
		name, body string
		env        []string
		want       string
	}{
		{"fraction", minimal + "retries: 1.5\n", nil, "config.yaml:5: retries: 1.5 is not a whole number"},
		{"fraction from env", minimal, []string{"KVROUTE_RETRIES=1.5"}, "environment variable KVROUTE_RETRIES: retries: 1.5 is not a whole number"},
		{"boolean for a number", minimal + "retries: true\n", nil, `config.yaml:5: retries: "true" is not a whole number`},
		{"number for a boolean", minimal + "expose_backend_names: 1\n", nil, "config.yaml:5: expose_backend_names: 1 is not true or false"},
		{"too large", minimal + "limits: {max_inflight: 99999999999999999999}\n", nil, "config.yaml:5: limits.max_inflight: 99999999999999999999 is not a whole number"},
		{"no value, string", minimal + "admin_listen:\n", nil, `config.yaml:5: admin_listen: has no value; write "" for none, or remove the key to keep the default (127.0.0.1:9090)`},
		{"no value, number", minimal + "retries: ~\n", nil, "config.yaml:5: retries: has no value; remove the key to keep the default (1), or give one"},
		{"date for a string", minimal + "session: {header: 2001-12-14}\n", nil, `config.yaml:5: session.header: want a string; write "2001-12-14" in quotes`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantLines(t, loadErr(t, c.body, c.env), c.want)
		})
	}
	// A dotted key is unknown, and only that is said of it.
	if got := loadErr(t, "\"timeouts.connect\": 5\n"+minimal, nil); strings.Count(got, "\n") != 0 || !strings.Contains(got, `unknown key "timeouts.connect"`) {
		t.Errorf("dotted key: %s", got)
	}
	// Numbers YAML reads exactly still load; so does a version written bare.
	env := []string{"KVROUTE_RETRIES=2", "KVROUTE_LIMITS_MAX_INFLIGHT=0x10"}
	c, err := LoadBytes("config.yaml", []byte(minimal+"limits: {max_body_bytes: 1e6}\ntls: {min_version: 1.3}\n"), env, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.MaxBodyBytes != 1e6 || c.TLS.MinVersion != "1.3" || c.Retries != 2 || c.Limits.MaxInflight != 16 {
		t.Errorf("exact numbers: %+v %+v retries %d", c.Limits, c.TLS, c.Retries)
	}
	if !slices.Equal(env, []string{"KVROUTE_RETRIES=2", "KVROUTE_LIMITS_MAX_INFLIGHT=0x10"}) {
		t.Errorf("LoadBytes reordered its env: %v", env)
	}
}
