package runner

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/bench/sim"
)

// The fleet's capacity follows the cost model: for 500-token prompts and
// 32-token answers on llama-8b-h100, full batches of 256 (max_num_seqs),
// each step decoding them and prefilling 8 prompts.
func TestNoisyCapacity(t *testing.T) {
	c, err := sim.PresetConfig("llama-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	got := noisyCapacity(c, 2, 500, 32)
	step := 7 + 256*0.03 + 3.9e-5*256*516 + 8*(0.028*500+2e-6*500*250)
	if got.Batch != 256 || math.Abs(got.StepMs-step) > 1e-9 || math.Abs(got.PerReplica-8000/step) > 1e-9 || got.Fleet != 2*got.PerReplica {
		t.Errorf("capacity %+v, want batch 256, step %.3f ms, %.3f req/s per replica", got, step, 8000/step)
	}
	// Long prompts are bound by the token budget of a step instead.
	if long := noisyCapacity(c, 1, 8000, 32); long.Batch >= 256 || long.Fleet >= got.PerReplica {
		t.Errorf("8k prompts: %+v, want a smaller batch and fewer requests", long)
	}
}

// The default flood leaves thousands of requests in flight through a
// router without flow control: a run in one process with too few open
// files is warned of, one with kvroute in its own process needs half.
func TestNoisyFDNote(t *testing.T) {
	o, err := DefaultOptions().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	o.Workload, o.Replicas, o.TimeScale = "noisy", NoisyReplicas, NoisyTimeScale
	simCfg, err := o.simConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := o.noisyPlan(simCfg)
	streams := p.openStreams(&o)
	if streams < 7000 || streams > 10000 {
		t.Errorf("%d requests in flight at most, want about 8,000 (the flood's excess over a minute, and full batches)", streams)
	}
	if p.fdNote(&o, 20000) == "" || p.fdNote(&o, 1<<20) != "" || p.fdNote(&o, 0) != "" {
		t.Error("in one process: want a note under 20,000 open files only")
	}
	o.KvrouteCommand = []string{"kvroute", "serve"}
	if n := p.fdNote(&o, 20000); n != "" {
		t.Errorf("kvroute in its own process: %s", n)
	}
}

// kvroute/cache_aware+flow is named on its own (not in all), and runs
// kvroute with flow control, its max_wait scaled, in-process and in a
// process of its own alike.
func TestFlowRouter(t *testing.T) {
	rs, _, err := ResolveRouters([]string{"cache_aware+flow", "cache_aware"}, false, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Name() != NameFlow || rs[0].(*Kvroute).Flow == nil || rs[1].(*Kvroute).Flow != nil {
		t.Fatalf("routers %v", rs)
	}
	all, _, _ := ResolveRouters([]string{"all"}, false, "/nonexistent", "/nonexistent")
	for _, r := range all {
		if strings.HasSuffix(r.Name(), flowSuffix) {
			t.Errorf("all includes %s", r.Name())
		}
	}
	k := &Kvroute{Policy: "cache_aware", TimeScale: 0.5, Flow: &FlowOptions{MaxWaiting: 4, MaxWait: 10 * time.Second, MaxQueued: 5000, Tenant: "header:X-Tenant", TenantMaxConcurrent: 7}}
	dir := t.TempDir()
	cfg, err := k.Config([]string{"http://127.0.0.1:8001"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.Flow
	if f.MaxWaiting != 4 || f.MaxWait != 5*time.Second || f.MaxQueued != 5000 || f.MaxQueuedBytes != 0 || f.Tenant != "header:X-Tenant" ||
		f.TenantLimits.MaxConcurrent != 7 {
		t.Errorf("flow %+v", f)
	}
	cfg.Listen, cfg.AdminListen = "127.0.0.1:8101", "127.0.0.1:8102"
	if _, got := writeProcessConfig(t, dir, cfg); got.Flow.MaxWaiting != 4 || got.Flow.MaxWait != 5*time.Second || got.Flow.Tenant != "header:X-Tenant" ||
		got.Flow.TenantLimits.MaxConcurrent != 7 {
		t.Errorf("the process loads flow %+v", got.Flow)
	}
	// Without Flow, the process file has no flow section.
	plain, err := (&Kvroute{Policy: "cache_aware"}).Config([]string{"http://127.0.0.1:8001"}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(processYAML(plain, "info"), "flow:") || plain.Flow.Queues() {
		t.Error("a kvroute without flow control has a flow section")
	}
}

// The noisy workload end to end, through kvroute with and without flow
// control, after the victim alone: the report splits every run by
// tenant, nothing is lost, and results.md and results.json carry it.
func TestNoisyEndToEnd(t *testing.T) {
	o := DefaultOptions()
	o.Workload = "noisy"
	o.Replicas = 1
	o.TimeScale = 0.05
	o.Noisy = NoisyOptions{VictimRate: 3, AggressorRate: 40, Warmup: 2 * time.Second, Flood: 4 * time.Second,
		Cooldown: 2 * time.Second, PromptTokens: 200, AnswerTokens: 8, Seed: 2}
	o.Flow = FlowOptions{MaxWaiting: 2, MaxWait: 20 * time.Second}
	o.Routers = []string{"cache_aware", "cache_aware+flow"}
	o.Out = t.TempDir()
	w, err := BuildWorkload(o)
	if err != nil {
		t.Fatal(err)
	}
	sent := map[string]int{}
	for _, r := range w.Requests {
		sent[r.Tenant]++
	}
	if sent[load.DefaultVictim] == 0 || sent[load.DefaultAggressor] == 0 || len(sent) != 2 {
		t.Fatalf("workload tenants %v", sent)
	}

	rep := runWithin(t, o, 30*time.Second)
	n := rep.Noisy
	if n == nil || n.Alone == nil || n.Flow == nil {
		t.Fatalf("noisy section %+v", n)
	}
	if n.VictimRate != 3 || n.AggressorRate != 40 || n.Capacity.Fleet <= 0 || n.Flow.MaxWaiting != 2 || n.Flow.MaxQueued != max(len(w.Requests), 1000) {
		t.Errorf("noisy setup %+v, flow %+v", n, n.Flow)
	}
	check := func(res *RouterResult, tenants ...string) {
		t.Helper()
		if res.Error != "" {
			t.Errorf("%s: %s", res.Router, res.Error)
		}
		names := make([]string, 0, len(res.Tenants))
		for _, tr := range res.Tenants {
			names = append(names, tr.Tenant)
			if tr.Sent != sent[tr.Tenant] || tr.Lost != 0 || tr.OK+tr.Refused429+tr.Refused503 != tr.Sent {
				t.Errorf("%s, %s: %+v, want %d sent, none lost", res.Router, tr.Tenant, tr, sent[tr.Tenant])
			}
			if tr.OK > 0 && tr.TTFT.P90 <= 0 {
				t.Errorf("%s, %s: no TTFT", res.Router, tr.Tenant)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, tenants) {
			t.Errorf("%s: tenants %q, want %q", res.Router, names, tenants)
		}
	}
	check(n.Alone, load.DefaultVictim)
	if v := n.Alone.Tenants[0]; v.OK != v.Sent || v.FloodOK == 0 || v.FloodTTFT.P90 <= 0 {
		t.Errorf("victim alone: %+v, want every request answered, some during the flood", v)
	}
	if len(rep.Results) != 2 || rep.Results[0].Router != "kvroute/cache_aware" || rep.Results[1].Router != NameFlow {
		t.Fatalf("results %d", len(rep.Results))
	}
	for i := range rep.Results {
		res := &rep.Results[i]
		check(res, load.DefaultAggressor, load.DefaultVictim)
		if !strings.Contains(rep.noisyLine(res), "× alone") && res.tenant(load.DefaultVictim).FloodOK > 0 {
			t.Errorf("summary line %q lacks the ratio to the victim alone", rep.noisyLine(res))
		}
	}
	if a := rep.Results[0].tenant(load.DefaultAggressor); a.Refused429+a.Refused503 != 0 {
		t.Errorf("kvroute without flow control refused %+v", a)
	}

	md, back := readReport(t, o.Out)
	for _, want := range []string{"### Noisy neighbour", "| " + NameNoisyAlone + " | victim |", "| " + NameFlow + " | aggressor |",
		"flow.max_waiting 2", "over its p90 alone"} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q:\n%s", want, md)
		}
	}
	if back.Noisy == nil || back.Noisy.Alone == nil || len(back.Results) != 2 || len(back.Results[1].Tenants) != 2 {
		t.Errorf("results.json round trip: %+v", back.Noisy)
	}
	conf, err := os.ReadFile(filepath.Join(o.Out, "routers", "kvroute_cache_aware+flow", "kvroute.yaml"))
	if err != nil || !strings.Contains(string(conf), "max_waiting: 2") || !strings.Contains(string(conf), `tenant: "header:X-Tenant"`) {
		t.Errorf("the flow router's kept configuration: %v\n%s", err, conf)
	}
	t.Logf("\n%s", md)
}
