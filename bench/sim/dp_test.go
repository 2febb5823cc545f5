package sim

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/kvevents"
)

// postRank sends a completion to url, pinned to rank when it is not "".
func postRank(t *testing.T, url, rank, prompt string) (int, string) {
	t.Helper()
	body := `{"model":"sim-test","prompt":` + strconv.Quote(prompt) + `,"max_tokens":2}`
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if rank != "" {
		req.Header.Set(headerRank, rank)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// Two servers of three ranks each: a request goes to the rank it names,
// /metrics tells the ranks apart, and each rank publishes its own events,
// tagged with its rank, on its server's first port + its rank.
func TestDataParallelRanks(t *testing.T) {
	cfg := fastConfig()
	cfg.DataParallelSize, cfg.KVEvents = 3, true
	f, err := StartFleet(context.Background(), 2, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	if len(f.Replicas) != 6 || len(f.URLs) != 6 || f.URLs[0] != f.URLs[2] || f.URLs[2] == f.URLs[3] {
		t.Fatalf("%d replicas at %v", len(f.Replicas), f.URLs)
	}
	evs := f.KVEvents()
	for i, rep := range f.Replicas {
		server, rank := i/3, i%3
		if want := "sim-" + strconv.Itoa(server) + "-dp" + strconv.Itoa(rank); rep.Config().Name != want {
			t.Errorf("replica %d named %s, want %s", i, rep.Config().Name, want)
		}
		if first := evs[server*3]; evs[i].Endpoint != backends.OffsetPort(first.Endpoint, rank) ||
			evs[i].ReplayEndpoint != backends.OffsetPort(first.ReplayEndpoint, rank) {
			t.Errorf("rank %d of server %d publishes on %+v, its rank 0 on %+v", rank, server, evs[i], first)
		}
	}

	url := f.URLs[3] // server 1
	for _, rank := range []string{"2", "2", "0"} {
		if code, out := postRank(t, url, rank, strings.Repeat("a prompt for rank "+rank+". ", 20)); code != 200 || !strings.Contains(out, "sim-1-dp"+rank+"-") {
			t.Errorf("rank %s: %d %s", rank, code, out)
		}
	}
	for _, bad := range []string{"3", "-1", "x"} {
		if code, out := postRank(t, url, bad, "p"); code != http.StatusBadRequest || !strings.Contains(out, "invalid_data_parallel_rank") {
			t.Errorf("rank %q: %d %s", bad, code, out)
		}
	}
	// Without a rank, the least busy; all are idle, so the next in turn:
	// rank 1, the first turn.
	if code, out := postRank(t, url, "", strings.Repeat("no rank. ", 40)); code != 200 || !strings.Contains(out, "sim-1-dp1-") {
		t.Errorf("no rank: %d %s", code, out)
	}
	wantReqs := []int64{0, 0, 0, 1, 1, 2}
	for i, rep := range f.Replicas {
		if got := rep.Stats().Requests; got != wantReqs[i] {
			t.Errorf("%s served %d, want %d", rep.Config().Name, got, wantReqs[i])
		}
	}

	resp, err := get(t, url+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	all, err := backends.ParseMetrics(strings.NewReader(string(body)), backends.EngineVLLM)
	if err != nil {
		t.Fatal(err)
	}
	capacity := int64(cfg.NumGPUBlocks * f.Replicas[0].Config().BlockSize)
	var queried float64
	for rank := range 3 {
		snap, err := backends.ParseRankMetrics(strings.NewReader(string(body)), backends.EngineVLLM, rank)
		if err != nil || snap.KVCapacityTokens != capacity || snap.PrefixQueries == 0 {
			t.Errorf("rank %d: %+v (%v)", rank, snap, err)
		}
		queried += snap.PrefixQueries
	}
	if all.KVCapacityTokens != 3*capacity || queried != all.PrefixQueries {
		t.Errorf("ranks queried %v tokens of %v, capacity %d", queried, all.PrefixQueries, all.KVCapacityTokens)
	}

	for rank := range 3 {
		rep := f.Replicas[3+rank]
		msgs := replay(t, rep, 0)
		if len(msgs) == 0 {
			t.Errorf("rank %d published nothing", rank)
		}
		for _, m := range msgs {
			b, err := kvevents.Decode(m.payload)
			if err != nil || b.DPRank != rank {
				t.Errorf("rank %d published a batch of rank %d (%v)", rank, b.DPRank, err)
			}
		}
	}
}
