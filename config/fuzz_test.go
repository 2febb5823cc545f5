package config

import (
	"errors"
	"strings"
	"testing"
)

// maxFuzzInput bounds the inputs FuzzLoad decodes. The fuzzer minimizes
// every input that finds new coverage, trying a number of candidates that
// grows with the square of its length, and reports no executions meanwhile
// (see fuzzMinimizeTime): small inputs keep that short. The repository's
// config.yaml, larger, is loaded by TestRepositoryConfigLoads.
const maxFuzzInput = 512

// FuzzLoad feeds arbitrary bytes as config.yaml to LoadBytes (no file, no
// environment, no flags, nothing kept between calls): it must answer with a
// configuration that validates or with errors that each say where they come
// from, never panic.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(seedSections))
	f.Add([]byte(minimal))
	f.Add([]byte("backends: [{name: a, url: 'http://127.0.0.1:1', models: [x, y]}]\nretries: 2\n"))
	f.Add([]byte("timeouts: {connect: -1s, first_byte: 30}\n"))
	f.Add([]byte("x: &a {listen: '127.0.0.1:1'}\n<<: *a\nbackends: [&b {name: a, url: 'http://127.0.0.1:1'}, *b]\n"))
	f.Add([]byte("polcy: x\n---\na: 1\n"))
	f.Add([]byte("{{{"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			return
		}
		c, err := LoadBytes("c.yaml", data, nil, nil)
		if err != nil {
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var ce *Error
				if !errors.As(e, &ce) {
					t.Fatalf("error without a source: %v", e)
				}
				if s := e.Error(); !strings.HasPrefix(s, "c.yaml") && !strings.HasPrefix(s, "default value: ") {
					t.Fatalf("error does not say where it comes from: %q", s)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("LoadBytes returned an invalid configuration: %v", err)
		}
	})
}

// seedSections sets a key of most sections, in under maxFuzzInput bytes.
const seedSections = `listen: "127.0.0.1:1"
admin_listen: ""
policy: session
backends:
- {name: a, url: "https://h:1", models: [m], weight: 2, backup: true, upstream_tls: {ca_file: c}}
limits: {max_inflight: 3}
retries: 0
timeouts: {connect: 1s, drain_delay: 0}
health: {fail_threshold: 1}
metrics: {interval: 1ms}
tokenizer: {encoding: o200k_base}
cache_aware: {lambda: 1.5, ttl: 1m}
session: {header: X}
auth: {api_keys: [abcdefgh]}
tls: {min_version: "1.3"}
expose_backend_names: false
responses: {ttl: 1h}
log: {level: warn}
`
