package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const minimal = `
backends:
  - name: a
    url: "http://127.0.0.1:8001"
`

func TestRepositoryConfigLoads(t *testing.T) {
	c, err := Load("../config.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	d := Defaults()
	if c.Listen != d["listen"] || c.Timeouts.FirstByte != 120*time.Second || c.Metrics.Interval != 250*time.Millisecond {
		t.Errorf("config.yaml disagrees with the defaults: %+v", c)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.Retries != 1 || c.Limits.MaxBodyBytes != 8<<20 ||
		c.Health.Interval != 2*time.Second || c.Backends[0].Engine != "vllm" || c.Session.Header != "X-Session-ID" {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestPrecedence(t *testing.T) {
	p := writeFile(t, minimal+"listen: \"127.0.0.1:7000\"\nretries: 3\n")
	t.Setenv("KVROUTE_RETRIES", "2")
	t.Setenv("KVROUTE_TIMEOUTS_FIRST_BYTE", "7s")
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("listen", "", "")
	if err := fs.Parse([]string{"--listen", "127.0.0.1:7001"}); err != nil {
		t.Fatal(err)
	}
	c, err := Load(p, fs)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:7001" {
		t.Errorf("flag did not override: %s", c.Listen)
	}
	if c.Retries != 2 || c.Timeouts.FirstByte != 7*time.Second {
		t.Errorf("env did not override: retries %d first_byte %v", c.Retries, c.Timeouts.FirstByte)
	}
}

func TestLoadErrorsNameTheField(t *testing.T) {
	cases := []struct{ name, body, field string }{
		{"unknown key", minimal + "listen_addr: x\n", "listen_addr"},
		{"unknown nested key", minimal + "timeouts:\n  first_bite: 1s\n", "first_bite"},
		{"no backends", "listen: \"127.0.0.1:1\"\n", "backends"},
		{"bad url", "backends:\n  - name: a\n    url: \"ftp://x:1\"\n", "backends[0].url"},
		{"duplicate", minimal + "  - name: a\n    url: \"http://127.0.0.1:2\"\n", "backends[1].name"},
		{"bad engine", "backends:\n  - name: a\n    url: \"http://127.0.0.1:1\"\n    engine: tgi\n", "backends[0].engine"},
		{"negative cache_tokens", "backends:\n  - name: a\n    url: \"http://127.0.0.1:1\"\n    cache_tokens: -5\n", "backends[0].cache_tokens"},
		{"bad policy", minimal + "policy: random\n", "policy"},
		{"bad duration", minimal + "timeouts:\n  connect: soon\n", "connect"},
		{"zero body", minimal + "limits:\n  max_body_bytes: 0\n", "limits.max_body_bytes"},
		{"bad listen", minimal + "listen: nowhere\n", "listen"},
		{"bad encoding", minimal + "tokenizer:\n  encoding: gpt2\n", "tokenizer.encoding"},
		{"negative bound floor", minimal + "policies:\n  cache_aware:\n    bound_floor: -1\n", "policies.cache_aware.bound_floor"},
		{"negative session epsilon", minimal + "policies:\n  session:\n    epsilon: -1\n", "policies.session.epsilon"},
		{"branch balance below 1", minimal + "policies:\n  cache_aware:\n    branch_balance: 0.5\n", "policies.cache_aware.branch_balance"},
		{"turn price below 0", minimal + "cache_aware:\n  turn_price: -0.5\n", "cache_aware.turn_price"},
		{"turn price above 1", minimal + "cache_aware:\n  turn_price: 2\n", "cache_aware.turn_price"},
		{"bad yaml", "backends: [", "config"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Load(writeFile(t, c.body), nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("error %q does not name %q", err, c.field)
			}
		})
	}
}

func TestDefaultValidWithABackend(t *testing.T) {
	c := Default()
	c.Backends = []Backend{{Name: "a", URL: "http://127.0.0.1:1", Engine: "vllm"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
