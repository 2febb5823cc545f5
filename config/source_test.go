package config

import (
	"errors"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kvroute/kvroute/router"
)

// loadErr loads body as config.yaml with env and the flags args and returns
// the error text, failing the test when the load succeeds.
func loadErr(t *testing.T, body string, env []string, args ...string) string {
	t.Helper()
	_, err := LoadBytes("config.yaml", []byte(body), env, flags(t, args...))
	if err == nil {
		t.Fatal("accepted")
	}
	return err.Error()
}

func flags(t *testing.T, args ...string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	for name := range FlagKeys {
		fs.String(name, "", "")
	}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// wantLines checks that each of want is one whole line of the error text.
func wantLines(t *testing.T, got string, want ...string) {
	t.Helper()
	lines := strings.Split(got, "\n")
	for _, w := range want {
		found := false
		for _, l := range lines {
			found = found || l == w
		}
		if !found {
			t.Errorf("no line %q in:\n%s", w, got)
		}
	}
}

// A bare number for a duration would be read as nanoseconds: it is
// rejected with the key, the value and the fix, from the file and from the
// environment. Written with a unit it loads.
func TestBareNumberDurationRejected(t *testing.T) {
	cases := []struct {
		name, body string
		env        []string
		want       string
	}{
		{"file int", minimal + "timeouts:\n  first_byte: 30\n", nil, "config.yaml:6: timeouts.first_byte: 30 has no unit; write 30s"},
		{"file quoted", minimal + "timeouts:\n  first_byte: \"30\"\n", nil, "config.yaml:6: timeouts.first_byte: 30 has no unit; write 30s"},
		{"file float", minimal + "metrics: {interval: 0.5}\n", nil, "config.yaml:5: metrics.interval: 0.5 has no unit; write 0.5s"},
		{"file hex", minimal + "health: {interval: 0x10}\n", nil, "config.yaml:5: health.interval: 0x10 has no unit; write 16s"},
		{"file exponent", minimal + "session: {ttl: 1e3}\n", nil, "config.yaml:5: session.ttl: 1e3 has no unit; write 1000s"},
		{"file negative", minimal + "responses: {ttl: -5}\n", nil, "config.yaml:5: responses.ttl: -5 has no unit; write -5s"},
		{"env", minimal, []string{"KVROUTE_METRICS_INTERVAL=1"}, "environment variable KVROUTE_METRICS_INTERVAL: metrics.interval: 1 has no unit; write 1s"},
		{"env over file", minimal + "timeouts: {first_byte: 30s}\n", []string{"KVROUTE_TIMEOUTS_FIRST_BYTE=30"}, "environment variable KVROUTE_TIMEOUTS_FIRST_BYTE: timeouts.first_byte: 30 has no unit; write 30s"},
		{"no number", minimal + "timeouts: {connect: soon}\n", nil, `config.yaml:5: timeouts.connect: "soon" is not a duration; write a number with a unit (30s, 250ms, 1m30s, 1h)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantLines(t, loadErr(t, c.body, c.env), c.want)
		})
	}
	c, err := LoadBytes("config.yaml", []byte(minimal+"timeouts: {first_byte: 30s, drain_delay: 0}\nmetrics: {interval: 1m30s}\n"), []string{"KVROUTE_HEALTH_INTERVAL=250ms"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Timeouts.FirstByte.Seconds() != 30 || c.Timeouts.DrainDelay != 0 || c.Metrics.Interval.Seconds() != 90 || c.Health.Interval.Milliseconds() != 250 {
		t.Errorf("durations with units: %+v %+v %+v", c.Timeouts, c.Metrics, c.Health)
	}
}

// Every time.Duration field, found by reflection (so fields added later are
// covered), rejects a bare number from the file and from the environment.
func TestEveryDurationRejectsBareNumber(t *testing.T) {
	var keys []string
	for k, st := range current().settables {
		if st.field.typ == durationType {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) < 14 {
		t.Fatalf("only %d duration keys found: %v", len(keys), keys)
	}
	for _, k := range keys {
		t.Run(k, func(t *testing.T) {
			// timeouts.first_byte → "timeouts:\n  first_byte: 7\n"
			parts := strings.Split(k, ".")
			var b strings.Builder
			for i, p := range parts {
				b.WriteString(strings.Repeat("  ", i) + p + ":")
				if i < len(parts)-1 {
					b.WriteString("\n")
				}
			}
			b.WriteString(" 7\n")
			named := k // a deprecated key's value is read as its replacement's
			if r, ok := replacement(k); ok {
				named = r
			}
			wantLines(t, loadErr(t, minimal+b.String(), nil), "config.yaml:"+strconv.Itoa(4+len(parts))+": "+named+": 7 has no unit; write 7s")
			wantLines(t, loadErr(t, minimal, []string{EnvName(k) + "=7"}), "environment variable "+EnvName(k)+": "+named+": 7 has no unit; write 7s")
		})
	}
}

// Every error says where the bad value came from: the file and line, the
// environment variable, the flag, or the default.
func TestErrorsNameTheirSource(t *testing.T) {
	cases := []struct {
		name, body string
		env, args  []string
		want       string
	}{
		{"file, decoding", minimal + "retries: three\n", nil, nil, `config.yaml:5: retries: "three" is not a whole number`},
		{"file, validation", minimal + "listen: nowhere\n", nil, nil, `config.yaml:5: listen: "nowhere" is not host:port: address nowhere: missing port in address`},
		{"file, backend item", minimal + "  - name: b\n    url: \"ftp://x:1\"\n", nil, nil, `config.yaml:6: backends[1].url: "ftp://x:1": scheme must be http or https`},
		{"file, missing key of an item", minimal + "  - url: \"http://127.0.0.1:2\"\n", nil, nil, `config.yaml:5: backends[1].name: is required`},
		{"file, nested", minimal + "tls:\n  cert_file: a.pem\n", nil, nil, `config.yaml:6: tls.cert_file: "a.pem" is set but tls.key_file is empty; set both or neither`},
		{"file, duplicate key", minimal + "policy: session\npolicy: least_load\n", nil, nil, `config.yaml:6: policy: is set twice (first on line 5); keep one`},
		{"file, weight 0", minimal + "    weight: 0\n", nil, nil, `config.yaml:5: backends[0].weight: must be positive (default 1), got 0`},
		{"file, no backends", "listen: \"127.0.0.1:1\"\n", nil, nil, `config.yaml: backends: at least one backend is required`},
		{"file, YAML syntax", "backends: [\n", nil, nil, `config.yaml:1: YAML: did not find expected node content`},
		{"env, decoding", minimal, []string{"KVROUTE_LIMITS_MAX_INFLIGHT=lots"}, nil, `environment variable KVROUTE_LIMITS_MAX_INFLIGHT: limits.max_inflight: "lots" is not a whole number`},
		{"env, validation", minimal, []string{"KVROUTE_POLICY=random"}, nil, `environment variable KVROUTE_POLICY: policy: unknown policy "random" (want one of ` + strings.Join(router.Names(), ", ") + ")"},
		{"env, empty number", minimal, []string{"KVROUTE_RETRIES="}, nil, `environment variable KVROUTE_RETRIES: retries: is empty; unset KVROUTE_RETRIES to keep the default (1), or give a value`},
		{"env, list", minimal, []string{"KVROUTE_BACKENDS=a"}, nil, `environment variable KVROUTE_BACKENDS: backends: a list of sections is set in the configuration file only`},
		{"flag", minimal, nil, []string{"--listen", "nowhere"}, `flag --listen: listen: "nowhere" is not host:port: address nowhere: missing port in address`},
		{"flag over env", minimal, []string{"KVROUTE_LOG_LEVEL=info"}, []string{"--log-level", "loud"}, `flag --log-level: log.level: unknown level "loud" (want debug, info, warn or error)`},
		{"default", minimal + "limits:\n  max_header_bytes: 100\n", nil, nil, `default value: limits.max_url_bytes: 8192 exceeds limits.max_header_bytes (100)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantLines(t, loadErr(t, c.body, c.env, c.args...), c.want)
		})
	}
}

// All errors are reported, each one once, as *Error values.
func TestAllErrorsReported(t *testing.T) {
	body := "polcy: x\ntimeouts:\n  first_byte: 30\nbackends:\n  - name: a\n    url: ftp://x:1\n"
	_, err := LoadBytes("config.yaml", []byte(body), []string{"KVROUTE_RETRIES=99"}, nil)
	if err == nil {
		t.Fatal("accepted")
	}
	errs := err.(interface{ Unwrap() []error }).Unwrap()
	if len(errs) != 4 {
		t.Errorf("want 4 errors, got %d:\n%v", len(errs), err)
	}
	for _, e := range errs {
		var ce *Error
		if !errors.As(e, &ce) || ce.Source.String() == "" {
			t.Errorf("error %q has no source", e)
		}
	}
}

// An unknown key names the closest known one, at the top level, in a
// section, in a backends item, and when it belongs to a section.
func TestUnknownKeySuggestions(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"top level", minimal + "polcy: session\n", `config.yaml:5: unknown key "polcy" (did you mean "policy"?)`},
		{"case", minimal + "Listen: \"127.0.0.1:1\"\n", `config.yaml:5: unknown key "Listen" (did you mean "listen"?)`},
		{"nested", minimal + "timeouts:\n  first_bite: 1s\n", `config.yaml:6: unknown key "timeouts.first_bite" (did you mean "timeouts.first_byte"?)`},
		{"backends item", minimal + "    ulr: \"http://127.0.0.1:2\"\n", `config.yaml:5: unknown key "backends[0].ulr" (did you mean "backends[0].url"?)`},
		{"second backends item", minimal + "  - name: b\n    url: \"http://127.0.0.1:2\"\n    wieght: 2\n", `config.yaml:7: unknown key "backends[1].wieght" (did you mean "backends[1].weight"?)`},
		{"backend upstream_tls", minimal + "    upstream_tls: {sever_name: x}\n", `config.yaml:5: unknown key "backends[0].upstream_tls.sever_name" (did you mean "backends[0].upstream_tls.server_name"?)`},
		{"prefix", minimal + "listen_addr: x\n", `config.yaml:5: unknown key "listen_addr" (did you mean "listen"?)`},
		{"outside its section", minimal + "first_byte: 30s\n", `config.yaml:5: unknown key "first_byte" (did you mean "timeouts.first_byte"?)`},
		{"nothing close", minimal + "metrics:\n  zzz: 1s\n", `config.yaml:6: unknown key "metrics.zzz" (known keys here: interval, timeout)`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wantLines(t, loadErr(t, c.body, nil), c.want)
		})
	}
}

// A KVROUTE_* variable that names no key is an error naming it and the
// closest known variable; the documented non-configuration ones are left
// alone.
func TestUnknownEnvVariable(t *testing.T) {
	cases := []struct{ env, want string }{
		{"KVROUTE_POLCY=session", "environment variable KVROUTE_POLCY: no configuration key is named KVROUTE_POLCY (did you mean KVROUTE_POLICY?)"},
		{"KVROUTE_TIMEOUTS_FIRST_BITE=1s", "environment variable KVROUTE_TIMEOUTS_FIRST_BITE: no configuration key is named KVROUTE_TIMEOUTS_FIRST_BITE (did you mean KVROUTE_TIMEOUTS_FIRST_BYTE?)"},
		{"KVROUTE_ADMINLISTEN=", "environment variable KVROUTE_ADMINLISTEN: no configuration key is named KVROUTE_ADMINLISTEN (did you mean KVROUTE_ADMIN_LISTEN?)"},
		{"KVROUTE_QQQQQQQQ=1", "environment variable KVROUTE_QQQQQQQQ: no configuration key is named KVROUTE_QQQQQQQQ (the closest known variable is KVROUTE_LISTEN)"},
	}
	for _, c := range cases {
		t.Run(c.env, func(t *testing.T) {
			wantLines(t, loadErr(t, minimal, []string{c.env}), c.want)
		})
	}
	ignored := []string{"KVTEST_CHAOS_REPRO=1", "KVTEST_TOKENIZE_NONET_CHILD=1", "KVROUTE_PORT=tcp://10.0.0.1:8080",
		"KVROUTE_PORT_8080_TCP_ADDR=10.0.0.1", "KVROUTE_SERVICE_HOST=10.0.0.1", "KVROUTE_SERVICE_PORT_HTTP=8080", "OTHER_POLCY=1"}
	if _, err := LoadBytes("config.yaml", []byte(minimal), ignored, nil); err != nil {
		t.Errorf("variables that are not configuration: %v", err)
	}
	// Load reads the process environment.
	t.Setenv("KVROUTE_POLCY", "session")
	if _, err := Load(writeFile(t, minimal), nil); err == nil || !strings.Contains(err.Error(), "KVROUTE_POLICY?") {
		t.Errorf("Load: %v", err)
	}
}

// An empty variable counts: KVROUTE_ADMIN_LISTEN= disables the admin
// listener; an empty string or list is the empty value where that means
// something, and an error where it cannot.
func TestEmptyEnvCounts(t *testing.T) {
	t.Setenv("KVROUTE_ADMIN_LISTEN", "")
	c, err := Load(writeFile(t, minimal), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.AdminListen != "" {
		t.Errorf("KVROUTE_ADMIN_LISTEN= left admin_listen at %q", c.AdminListen)
	}
	c, err = LoadBytes("config.yaml", []byte(minimal+"auth: {api_keys: [abcdefgh], admin_token: secret}\n"), []string{"KVROUTE_AUTH_API_KEYS=", "KVROUTE_AUTH_ADMIN_TOKEN=", "KVROUTE_ADMIN_LISTEN="}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Auth.APIKeys) != 0 || c.Auth.AdminToken != "" || c.AdminListen != "" {
		t.Errorf("empty variables ignored: %+v admin_listen %q", c.Auth, c.AdminListen)
	}
	c, err = LoadBytes("config.yaml", []byte(minimal), []string{"KVROUTE_AUTH_API_KEYS=abcdefgh, ijklmnop"}, nil)
	if err != nil || !reflect.DeepEqual(c.Auth.APIKeys, []string{"abcdefgh", "ijklmnop"}) {
		t.Errorf("list from the environment: %v %v", c, err)
	}
	for env, want := range map[string]string{
		"KVROUTE_LISTEN=":               "environment variable KVROUTE_LISTEN: listen: is empty; want host:port",
		"KVROUTE_SESSION_HEADER=":       "environment variable KVROUTE_SESSION_HEADER: session.header: must not be empty",
		"KVROUTE_TIMEOUTS_CONNECT=":     "environment variable KVROUTE_TIMEOUTS_CONNECT: timeouts.connect: is empty; unset KVROUTE_TIMEOUTS_CONNECT to keep the default (2s), or give a value",
		"KVROUTE_EXPOSE_BACKEND_NAMES=": "environment variable KVROUTE_EXPOSE_BACKEND_NAMES: expose_backend_names: is empty; unset KVROUTE_EXPOSE_BACKEND_NAMES to keep the default (true), or give a value",
		"KVROUTE_AUTH_API_KEYS=a,,b":    `environment variable KVROUTE_AUTH_API_KEYS: auth.api_keys[1]: is empty; separate the items with single commas`,
	} {
		t.Run(env, func(t *testing.T) {
			wantLines(t, loadErr(t, minimal, []string{env}), want)
		})
	}
	// An empty --admin-listen disables it too.
	c, err = LoadBytes("config.yaml", []byte(minimal), nil, flags(t, "--admin-listen="))
	if err != nil || c.AdminListen != "" {
		t.Errorf("--admin-listen=: %v %v", c, err)
	}
}

// Credentials are never shown in errors.
func TestErrorsHideSecrets(t *testing.T) {
	for _, c := range []struct {
		body string
		env  []string
	}{
		{minimal + "auth: {api_keys: sekrit-key}\n", nil},
		{minimal + "auth: {api_keys: [sekrit]}\n", nil},
		{minimal, []string{"KVROUTE_AUTH_API_KEYS=sekrit,,x"}},
		{minimal, []string{"KVROUTE_AUTH_API_KEYS=sekrit"}},
	} {
		if got := loadErr(t, c.body, c.env); strings.Contains(got, "sekrit") {
			t.Errorf("error shows a credential: %s", got)
		}
	}
}

// The schema found by reflection agrees with Defaults, FlagKeys and the
// environment names.
func TestSchema(t *testing.T) {
	for k := range Defaults() {
		if _, ok := current().settables[k]; !ok {
			t.Errorf("Defaults has %q, which is no key of Config", k)
		}
	}
	for k, st := range current().settables {
		if _, ok := Defaults()[k]; !ok && !deprecated(k) {
			t.Errorf("key %s (%s) has no entry in Defaults", k, st.field.typ)
		}
	}
	for flag, k := range FlagKeys {
		if _, ok := current().settables[k]; !ok {
			t.Errorf("flag --%s names %q, which is no key of Config", flag, k)
		}
	}
	if n := len(current().settables) + len(current().lists); len(current().env) != n {
		t.Errorf("%d keys but %d environment variables: two keys share a variable", n, len(current().env))
	}
	for name := range current().env {
		if IgnoredEnv(name) {
			t.Errorf("%s names a key but is ignored", name)
		}
	}
	if !current().lists["backends"] || current().settables["timeouts.first_byte"].field == nil {
		t.Errorf("schema: lists %v", current().lists)
	}
}

// Anchors, aliases and merge keys are read as YAML defines them, with
// each value's line.
func TestYAMLAliasesAndMerges(t *testing.T) {
	body := `common: &tls {server_name: s, ca_file: ca.pem}
`
	wantLines(t, loadErr(t, body+minimal, nil), `config.yaml:1: unknown key "common" (known keys here: listen, admin_listen, policy, policies, backends, limits, retries, timeouts, health, metrics, tokenizer, index, cache_aware, session, flow, cache_salt, disaggregation, discovery, auth, log, tls, admin_tls, upstream_tls, expose_backend_names, expose_route_reason, responses, cluster, precise)`)
	body = `upstream_tls: &tls {server_name: s, ca_file: ca.pem}
backends:
  - &a {name: a, url: "http://127.0.0.1:1", upstream_tls: *tls}
  - <<: *a
    name: b
`
	c, err := LoadBytes("config.yaml", []byte(body), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Backends) != 2 || c.Backends[1].Name != "b" || c.Backends[1].URL != "http://127.0.0.1:1" || c.Backends[1].UpstreamTLS == nil || c.Backends[1].UpstreamTLS.ServerName != "s" {
		t.Errorf("merged backends: %+v", c.Backends)
	}
	// Aliases that expand without bound are refused, quickly.
	bomb := "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for i := 0; i < 12; i++ {
		name := "m" + string(rune('a'+i))
		bomb += name + ": &" + name + " {<<: [*" + prev + ", *" + prev + ", *" + prev + "]}\n"
		prev = name
	}
	if _, err := LoadBytes("config.yaml", []byte(bomb), nil, nil); err == nil {
		t.Error("alias bomb accepted")
	}
	wantLines(t, loadErr(t, minimal+"---\npolicy: session\n", nil), "config.yaml:5: a second YAML document (after ---); the configuration is one document")
	wantLines(t, loadErr(t, "- a\n", nil), "config.yaml:1: the file must hold a mapping of keys (listen: ..., backends: ...), not a list")
}

// FuzzLoad's seed that covers most sections loads, and is small enough to
// be fuzzed.
func TestFuzzSeedLoads(t *testing.T) {
	if len(seedSections) > maxFuzzInput {
		t.Errorf("seedSections is %d bytes, over maxFuzzInput (%d)", len(seedSections), maxFuzzInput)
	}
	if _, err := LoadBytes("seed.yaml", []byte(seedSections), nil, nil); err != nil {
		t.Error(err)
	}
}
