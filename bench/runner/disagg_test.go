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
}
