package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/bench/sim"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/kvevents"
)

// With kv_events.listen kvroute listens for the engine's publisher, which
// dials it (as vLLM does when its endpoint names a host). A replica whose
// allow_from is left empty admits its own URL's host (127.0.0.1 here) and
// is followed; one that admits only ::1 refuses the same publisher before
// reading a byte of it, counts the refusal and stays degraded.
func TestPreciseEventsListen(t *testing.T) {
	f, err := sim.StartFleet(context.Background(), 2, 0, sim.Config{Preset: "llama-8b-h100", Model: preciseModel, NumGPUBlocks: 1000, BlockSize: 16})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	addrs, err := loopback.FreeAddrs(2)
	if err != nil {
		t.Fatal(err)
	}
	k := kvtest.Start(t, nil, func(cfg *config.Config) {
		cfg.Policy = "cache_aware"
		cfg.Backends = []config.Backend{
			{Name: "open", URL: f.URLs[0], Engine: "vllm", KVEvents: &config.KVEvents{Listen: "tcp://" + addrs[0]}},
			{Name: "closed", URL: f.URLs[1], Engine: "vllm", KVEvents: &config.KVEvents{Listen: "tcp://" + addrs[1], AllowFrom: []string{"::1"}}},
		}
		cfg.Precise.RenderURL = f.URLs[0]
	})
	type evStatus struct {
		Connected, Listening bool
		Batches, Connects    uint64
	}
	status := func() map[string]evStatus {
		var states []struct {
			Name     string   `json:"name"`
			KVEvents evStatus `json:"kv_events"`
		}
		getJSON(t, k.Admin+"/debug/backends", &states)
		out := map[string]evStatus{}
		for _, s := range states {
			out[s.Name] = s.KVEvents
		}
		return out
	}
	kvtest.WaitFor(t, 10*time.Second, "both sockets listening", func() bool {
		st := status()
		return st["open"].Listening && st["closed"].Listening
	})
	dial := func(addr string) (*kvevents.Publisher, error) {
		p, err := kvevents.NewPublisher(kvevents.PubOptions{Endpoint: "tcp://" + addr, Connect: true, Encoding: kvevents.Tagged})
		if err == nil {
			t.Cleanup(func() { _ = p.Close() })
		}
		return p, err
	}
	if _, err := dial(addrs[1]); err == nil {
		t.Error("a publisher from an address not allowed finished its handshake")
	}
	p, err := dial(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, 10*time.Second, "the open replica's first batch", func() bool {
		if err := p.Publish(kvevents.Batch{TS: float64(time.Now().Unix()), Events: []kvevents.Event{kvevents.AllBlocksCleared{}}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		return status()["open"].Batches > 0
	})
	st := status()
	if o := st["open"]; !o.Connected || o.Connects != 1 {
		t.Errorf("open replica's events %+v, want connected once", o)
	}
	if c := st["closed"]; c.Connected || c.Batches != 0 || c.Connects != 0 {
		t.Errorf("closed replica's events %+v: the refused publisher got through", c)
	}
	refused := map[string]float64{}
	for _, s := range scrape(t, k.Admin)["kvroute_kv_events_rejected_total"] {
		if s.labels["reason"] == "peer_refused" {
			refused[s.labels["backend"]] += s.value
		}
	}
	if refused["open"] != 0 || refused["closed"] < 1 {
		t.Errorf("peer_refused by backend %v, want the closed replica's only", refused)
	}
	if got := fmt.Sprint(routingGauge(t, k)); got != "map[closed:degraded events_disconnected open:exact ]" {
		t.Errorf("routing states %s", got)
	}
}
