package runner

import (
	"strings"
	"testing"
)

func TestSplits(t *testing.T) {
	cases := []struct {
		list     []string
		protocol string
		want     string // labels and roles, or the error
	}{
		{nil, "", ""},
		{[]string{"2:6", " 4:4"}, "sglang", "2:6 ppdddddd; 4:4 ppppdddd; "},
		{[]string{"2:5"}, "", "2+5 replicas, want the fleet's 8"},
		{[]string{"0:8"}, "", "both at least 1"},
		{[]string{"2-6"}, "", "want P:D"},
		{[]string{"2:6"}, "nixl", `disaggregation protocol "nixl"`},
	}
	for _, tc := range cases {
		o := Options{Replicas: 8, Disaggregated: tc.list, DisaggregationProtocol: tc.protocol}
		sp, err := o.splits()
		var got strings.Builder
		for _, s := range sp {
			got.WriteString(s.label + " ")
			for _, r := range s.roles {
				got.WriteByte(r[0])
			}
			got.WriteString("; ")
		}
		if err != nil {
			got.WriteString(err.Error())
		}
		if !strings.Contains(got.String(), tc.want) || tc.want == "" && got.Len() > 0 {
			t.Errorf("splits(%v, %q) = %q, want %q", tc.list, tc.protocol, got.String(), tc.want)
		}
	}
}

// A split twin's configuration gives each backend its role and names the
// protocol, and loads as kvroute would load it.
func TestSplitConfig(t *testing.T) {
	o := Options{Replicas: 3, Disaggregated: []string{"1:2"}}
	routers := withSplits([]Router{&Kvroute{Policy: "cache_aware"}, &Nginx{}}, &o)
	if len(routers) != 3 {
		t.Fatalf("%d routers, want the two and one twin", len(routers))
	}
	k := routers[2].(*Kvroute)
	if k.Name() != "kvroute/cache_aware pd=1:2 vllm" {
		t.Errorf("name %q", k.Name())
	}
	cfg, err := k.Config([]string{"http://127.0.0.1:20501", "http://127.0.0.1:20502", "http://127.0.0.1:20503"}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Disaggregation.Protocol != "vllm" || cfg.Backends[0].Role != "prefill" || cfg.Backends[1].Role != "decode" || cfg.Backends[2].Role != "decode" {
		t.Errorf("protocol %q, roles %q %q %q", cfg.Disaggregation.Protocol, cfg.Backends[0].Role, cfg.Backends[1].Role, cfg.Backends[2].Role)
	}
	if cfg.Disaggregation.LocalPrefillTokens != 0 {
		t.Errorf("local_prefill_tokens %d without the option", cfg.Disaggregation.LocalPrefillTokens)
	}
}

// --local-prefill-tokens reaches the cache_aware twins of a vLLM split,
// named for it, and no twin of a policy that keys no prompt, nor an
// SGLang split.
func TestSplitLocalPrefill(t *testing.T) {
	urls := []string{"http://127.0.0.1:20501", "http://127.0.0.1:20502", "http://127.0.0.1:20503"}
	cases := []struct {
		policy, protocol, name string
		local, backlog, max    int
	}{
		{"cache_aware", "vllm", "kvroute/cache_aware pd=1:2 vllm local=1024 backlog=65536 max_running=2", 1024, 65536, 2},
		{"round_robin", "vllm", "kvroute/round_robin pd=1:2 vllm", 0, 0, 0},
		{"cache_aware", "sglang", "kvroute/cache_aware pd=1:2 sglang", 0, 0, 0},
	}
	for _, tc := range cases {
		o := Options{Replicas: 3, Disaggregated: []string{"1:2"}, DisaggregationProtocol: tc.protocol, LocalPrefillTokens: 1024, LocalPrefillBacklog: 65536, LocalPrefillMaxRunning: 2}
		k := withSplits([]Router{&Kvroute{Policy: tc.policy}}, &o)[1].(*Kvroute)
		cfg, err := k.Config(urls, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		if d := cfg.Disaggregation; k.Name() != tc.name || d.LocalPrefillTokens != tc.local || d.LocalPrefillBacklog != tc.backlog || d.LocalPrefillMaxRunning != tc.max {
			t.Errorf("%s %s: name %q, local_prefill_tokens %d, local_prefill_backlog %d, local_prefill_max_running %d; want %q, %d, %d, %d",
				tc.policy, tc.protocol, k.Name(), d.LocalPrefillTokens, d.LocalPrefillBacklog, d.LocalPrefillMaxRunning, tc.name, tc.local, tc.backlog, tc.max)
		}
	}
}
