package backends

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

func TestExpandRanks(t *testing.T) {
	in := []Spec{
		{Name: "one", URL: "http://127.0.0.1:8001", Engine: EngineVLLM},
		{Name: "dp", URL: "http://127.0.0.1:8002", Engine: EngineVLLM, DataParallelSize: 3, Models: []string{"m"},
			KVEvents: KVEvents{Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://127.0.0.1:6000", Topic: "kv"}},
		{Name: "sized1", URL: "http://127.0.0.1:8003", Engine: EngineSGLang, DataParallelSize: 1},
	}
	out := ExpandRanks(in)
	want := []struct {
		name             string
		rank             int
		endpoint, replay string
	}{
		{"one", 0, "", ""},
		{"dp-dp0", 0, "tcp://*:5557", "tcp://127.0.0.1:6000"},
		{"dp-dp1", 1, "tcp://*:5558", "tcp://127.0.0.1:6001"},
		{"dp-dp2", 2, "tcp://*:5559", "tcp://127.0.0.1:6002"},
		{"sized1", 0, "", ""},
	}
	if len(out) != len(want) {
		t.Fatalf("%d specs, want %d: %+v", len(out), len(want), out)
	}
	for i, w := range want {
		s := out[i]
		if s.Name != w.name || s.DataParallelRank != w.rank || s.KVEvents.Endpoint != w.endpoint || s.KVEvents.ReplayEndpoint != w.replay {
			t.Errorf("spec %d: %s rank %d events %q %q, want %+v", i, s.Name, s.DataParallelRank, s.KVEvents.Endpoint, s.KVEvents.ReplayEndpoint, w)
		}
	}
	out[1].Models[0] = "changed"
	if in[1].Models[0] != "m" || out[2].Models[0] != "m" {
		t.Error("the rank specs share their Models slice")
	}
	if got := ExpandRanks(in[:1]); &got[0] != &in[0] {
		t.Error("specs without ranks are copied")
	}
	if err := ValidateSpecs(out); err != nil {
		t.Errorf("expanded specs do not validate: %v", err)
	}
}

func TestOffsetPort(t *testing.T) {
	for _, tt := range []struct {
		in   string
		by   int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"tcp://h:65535", 1, "tcp://h:65535"},
		{"tcp://h", 1, "tcp://h"},
		{"", 1, ""},
	} {
		if got := OffsetPort(tt.in, tt.by); got != tt.want {
			t.Errorf("OffsetPort(%q, %d) = %q, want %q", tt.in, tt.by, got, tt.want)
		}
	}
}

func TestRankValidation(t *testing.T) {
	for _, tt := range []struct {
		size, rank int
		err        string
	}{
		{0, 0, ""},
		{1, 0, ""},
		{4, 3, ""},
		{-1, 0, "data-parallel size -1"},
		{MaxDataParallelSize + 1, 0, "data-parallel size 1025"},
		{1, 1, "rank set without"},
		{0, 2, "rank set without"},
		{4, 4, "rank 4 is not in 0..3"},
		{4, -1, "rank -1 is not in 0..3"},
	} {
		err := ValidateSpecs([]Spec{{Name: "a", URL: "http://127.0.0.1:1", Engine: EngineVLLM, DataParallelSize: tt.size, DataParallelRank: tt.rank}})
		if (err == nil) != (tt.err == "") || (err != nil && !strings.Contains(err.Error(), tt.err)) {
			t.Errorf("size %d rank %d: error %v, want %q", tt.size, tt.rank, err, tt.err)
		}
	}
}

func TestParseRankMetrics(t *testing.T) {
	vllm := `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3
vllm:num_requests_waiting{engine="1",model_name="m"} 5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7
vllm:num_requests_running{engine="1",model_name="m"} 11
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="200"} 1
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m"} 40
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m"} 100
`
	sgl := `sglang:num_queue_reqs{dp_rank="0"} 2
sglang:num_queue_reqs{dp_rank="1"} 9
sglang:num_running_reqs{dp_rank="0"} 1
sglang:num_running_reqs{dp_rank="1"} 4
sglang:token_usage{dp_rank="0"} 0.5
sglang:token_usage{dp_rank="1"} 0.1
`
	for _, tt := range []struct {
		name   string
		engine Engine
		in     string
		rank   int
		want   Snapshot
	}{
		{"vllm all", EngineVLLM, vllm, -1, Snapshot{Waiting: 8, Running: 18, KVUsage: 0.75, KVCapacityTokens: 4800, BlockSize: 16,
			PrefixHits: 40, PrefixQueries: 100, CacheHitRate: 0.4}},
		// Series without the engine label (the server-wide counters) stay.
		{"vllm rank 0", EngineVLLM, vllm, 0, Snapshot{Waiting: 3, Running: 7, KVUsage: 0.25, KVCapacityTokens: 1600, BlockSize: 16,
			PrefixHits: 40, PrefixQueries: 100, CacheHitRate: 0.4}},
		{"vllm rank 1", EngineVLLM, vllm, 1, Snapshot{Waiting: 5, Running: 11, KVUsage: 0.75, KVCapacityTokens: 3200, BlockSize: 16,
			PrefixHits: 40, PrefixQueries: 100, CacheHitRate: 0.4}},
		{"sglang rank 1", EngineSGLang, sgl, 1, Snapshot{Waiting: 9, Running: 4, KVUsage: 0.1, BlockSize: 1}},
		// SGLang's rank label is not vLLM's: an sglang rank ignores engine="…".
		{"sglang ignores the vllm label", EngineSGLang, "sglang:num_queue_reqs{engine=\"1\"} 6\n", 0, Snapshot{Waiting: 6, BlockSize: 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRankMetrics(strings.NewReader(tt.in), tt.engine, tt.rank)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	// A rank the engine does not have leaves none of its load gauges.
	if _, err := ParseRankMetrics(strings.NewReader(sgl), EngineSGLang, 5); err == nil {
		t.Error("a rank without series parsed")
	}
}

// TestRankReplicas serves one engine of two data-parallel ranks over HTTP
// and checks that each rank's replica reads its own load and pins its
// requests to its rank, whatever rank the client asked for.
func TestRankReplicas(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = w.Write([]byte("vllm:num_requests_waiting{engine=\"0\"} 4\nvllm:num_requests_waiting{engine=\"1\"} 6\n"))
		case "/echo":
			_, _ = w.Write([]byte(strings.Join(r.Header.Values(HeaderDataParallelRank), ",")))
		default:
			w.WriteHeader(http.StatusOK)
		}
	}))
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)

	specs := ExpandRanks([]Spec{
		{Name: "e", URL: srv.URL, Engine: EngineVLLM, Models: []string{"m"}, DataParallelSize: 2},
		{Name: "plain", URL: srv.URL, Engine: EngineVLLM, Models: []string{"m"}},
	})
	f := newTestFleet(t, specs, Options{StaleAfter: time.Minute})
	f.CheckNow(context.Background())
	for _, tt := range []struct {
		name    string
		waiting float64
		rank    int
		ranked  bool
		sent    string // the rank header the engine saw
	}{
		{"e-dp0", 4, 0, true, "0"},
		{"e-dp1", 6, 1, true, "1"},
		{"plain", 10, 0, false, "7"},
	} {
		r := f.ByName(tt.name)
		if r == nil {
			t.Fatalf("no replica %s", tt.name)
		}
		if s := r.Snapshot(); s == nil || s.Waiting != tt.waiting {
			t.Errorf("%s: snapshot %+v, want waiting %v", tt.name, s, tt.waiting)
		}
		if rank, ok := r.DataParallelRank(); rank != tt.rank || ok != tt.ranked {
			t.Errorf("%s: DataParallelRank %d %v", tt.name, rank, ok)
		}
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.Header.Set(HeaderDataParallelRank, "7")
		r.SetRequestURI(req, []byte("/echo"))
		err := r.Client().DoTimeout(req, resp, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(resp.Body()); got != tt.sent {
			t.Errorf("%s: the engine saw rank %q, want %q", tt.name, got, tt.sent)
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
}
