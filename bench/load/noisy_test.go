package load

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"
)

// noisyOptions is a small noisy workload: 10 s of victim, a 4 s flood.
func noisyOptions() NoisyOptions {
	return NoisyOptions{VictimRate: 5, AggressorRate: 50, Warmup: 3 * time.Second, Flood: 4 * time.Second,
		Cooldown: 3 * time.Second, PromptTokens: 300, MaxTokens: 16, Seed: 7}
}

// Noisy is deterministic; the victim sends for the whole run and the
// aggressor only during the flood, every request with its tenant and a
// prompt shared with no other; without the aggressor the victim's
// requests are the very same.
func TestNoisy(t *testing.T) {
	opt := noisyOptions()
	w := Noisy(opt)
	if !reflect.DeepEqual(w, Noisy(opt)) {
		t.Fatal("not deterministic")
	}
	start, end := opt.FloodWindow()
	if start != 3*time.Second || end != 7*time.Second {
		t.Fatalf("flood window [%v, %v), want [3s, 7s)", start, end)
	}
	var victim, aggressor []Request
	seen := map[string]bool{}
	var victimLate bool
	for i, r := range w.Requests {
		if i > 0 && r.At < w.Requests[i-1].At {
			t.Fatalf("request %d arrives before %d", i, i-1)
		}
		if r.DependsOn != -1 || r.SendsAnswer || r.Session != "" || r.MaxTokens != 16 || len(r.Messages) != 1 ||
			r.PromptTokens != tokensOf(len(renderChat(r.Messages))) || r.PromptTokens < 300 || r.PromptTokens > 305 {
			t.Fatalf("request %d: %+v", i, r)
		}
		if seen[r.Messages[0].Content] {
			t.Fatalf("request %d repeats a prompt", i)
		}
		seen[r.Messages[0].Content] = true
		switch r.Tenant {
		case DefaultVictim:
			victim = append(victim, r)
			victimLate = victimLate || r.At >= end
			if r.At >= end+opt.Cooldown {
				t.Errorf("victim request at %v, after the run", r.At)
			}
		case DefaultAggressor:
			aggressor = append(aggressor, r)
			if r.At < start || r.At >= end {
				t.Errorf("aggressor request at %v, outside the flood [%v, %v)", r.At, start, end)
			}
		default:
			t.Fatalf("request %d: tenant %q", i, r.Tenant)
		}
	}
	// Poisson counts: 50 ± 4σ victims over 10 s, 200 ± 4σ aggressors over 4 s.
	if len(victim) < 22 || len(victim) > 78 || len(aggressor) < 143 || len(aggressor) > 257 || !victimLate {
		t.Fatalf("%d victim requests (some after the flood: %t), %d aggressor requests", len(victim), victimLate, len(aggressor))
	}
	if IdealHitRate(w, 16) != 0 {
		t.Errorf("ideal hit rate %v, want 0: no prompt shares a block", IdealHitRate(w, 16))
	}

	alone := opt
	alone.AggressorRate = 0
	if got := Noisy(alone).Requests; !reflect.DeepEqual(got, victim) {
		t.Errorf("the victim alone sends %d requests, not the %d it sends beside the aggressor", len(got), len(victim))
	}
	other := opt
	other.Seed++
	if reflect.DeepEqual(Noisy(other).Requests, w.Requests) {
		t.Error("another seed gives the same requests")
	}
}

// Run sends each request's tenant in X-Tenant (or the header RunOptions
// names) and keeps it in the sample, sent or not.
func TestRunSendsTenant(t *testing.T) {
	for _, header := range []string{"", "X-Org"} {
		var mu sync.Mutex
		got := map[string]int{}
		f := newFakeServer(t, 0, 0)
		want := header
		if want == "" {
			want = DefaultTenantHeader
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got[r.Header.Get(want)]++
			mu.Unlock()
			f.serve(w, r)
		}))
		t.Cleanup(srv.Close)
		w := &Workload{Requests: []Request{msgReq(0, "a", 2), msgReq(0, "b", 2), msgReq(0, "c", 2)}}
		w.Requests[0].Tenant, w.Requests[1].Tenant = "acme", "acme"
		res, err := Run(context.Background(), srv.URL, w, RunOptions{Model: "test-model", TenantHeader: header})
		if err != nil {
			t.Fatal(err)
		}
		if got["acme"] != 2 || got[""] != 1 {
			t.Errorf("header %q: tenants received %v, want 2 acme and 1 without", want, got)
		}
		tenants := []string{}
		for _, s := range res.Samples {
			tenants = append(tenants, s.Tenant)
		}
		if !slices.Equal(tenants, []string{"acme", "acme", ""}) {
			t.Errorf("samples' tenants %q", tenants)
		}
	}
	// Not sent: the tenant is kept all the same.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := &Workload{Requests: []Request{msgReq(time.Hour, "late", 2)}}
	w.Requests[0].Tenant = "acme"
	res, _ := Run(ctx, "http://127.0.0.1:1", w, RunOptions{})
	if s := res.Samples[0]; s.Sent || s.Tenant != "acme" {
		t.Errorf("unsent sample %+v, want its tenant", s)
	}
}

// Filter keeps the samples asked for, in order, and the run's wall time.
func TestResultFilter(t *testing.T) {
	r := &Result{Wall: time.Second, Samples: []Sample{{Tenant: "a"}, {Tenant: "b"}, {Tenant: "a", Sent: true}}}
	f := r.Filter(func(_ int, s *Sample) bool { return s.Tenant == "a" })
	if f.Wall != time.Second || len(f.Samples) != 2 || f.Samples[1].Sent != true {
		t.Errorf("filtered %+v", f)
	}
}
