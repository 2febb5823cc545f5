package backends

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readTestdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseMetricsTestdata(t *testing.T) {
	tests := []struct {
		file   string
		engine Engine
		want   Snapshot
	}{
		{
			file: "vllm_v1.txt", engine: EngineVLLM,
			want: Snapshot{
				Waiting: 5, Running: 21, KVUsage: 0.4213,
				KVCapacityTokens: 2 * 27000 * 16, BlockSize: 16,
				PrefixHits: 1207114 + 946229, PrefixQueries: 1843522 + 1521087,
				CacheHitRate: (1207114.0 + 946229) / (1843522 + 1521087),
			},
		},
		{
			file: "vllm_old.txt", engine: EngineVLLM,
			want: Snapshot{
				Waiting: 1, Running: 7, KVUsage: 0.8125,
				KVCapacityTokens: 7282 * 16, BlockSize: 16,
				PrefixHits: 331904, PrefixQueries: 884213,
				CacheHitRate: 331904.0 / 884213,
			},
		},
		{
			file: "sglang.txt", engine: EngineSGLang,
			want: Snapshot{
				Waiting: 2826, Running: 162, KVUsage: 0.28,
				KVCapacityTokens: 442368, BlockSize: 1,
				CacheHitRate: 0.007507552643049313,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(string(readTestdata(t, tt.file))), tt.engine)
			if err != nil {
				t.Fatalf("ParseMetrics: %v", err)
			}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseMetricsCases(t *testing.T) {
	const m = `model_name="m"`
	tests := []struct {
		name    string
		engine  Engine
		in      string
		want    Snapshot
		wantErr error // nil: no error; errAny: any error
	}{
		{name: "empty", engine: EngineVLLM, in: "", wantErr: ErrNoEngineMetrics},
		{name: "only noise", engine: EngineVLLM, in: "# HELP up x\n# TYPE up gauge\nup 1\nprocess_open_fds 12\n", wantErr: ErrNoEngineMetrics},
		{name: "garbage", engine: EngineVLLM, in: "this is not prometheus {{{", wantErr: errAny},
		{name: "html", engine: EngineSGLang, in: "<html><body>404 Not Found</body></html>\n", wantErr: errAny},
		{name: "binary", engine: EngineVLLM, in: "\x00\xff\xfe\x01vllm:num_requests_waiting 3", wantErr: errAny},
		{name: "unknown engine", engine: "tgi", in: "vllm:num_requests_waiting 1\n", wantErr: errAny},
		{name: "sglang text read as vllm", engine: EngineVLLM, in: "sglang:num_queue_reqs{" + m + "} 4\n", wantErr: ErrNoEngineMetrics},
		{name: "duplicate TYPE", engine: EngineVLLM, in: "# TYPE vllm:num_requests_waiting gauge\n# TYPE vllm:num_requests_waiting gauge\n", wantErr: errAny},
		{
			name: "untyped minimal", engine: EngineVLLM,
			in:   "vllm:num_requests_waiting 2\nvllm:num_requests_running 3\n",
			want: Snapshot{Waiting: 2, Running: 3},
		},
		{
			name: "several model_name series: sum counts, max usage", engine: EngineVLLM,
			in: `# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a"} 1
vllm:num_requests_waiting{model_name="b"} 2.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 4
vllm:num_requests_running{model_name="b"} 6
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="a"} 0.25
vllm:kv_cache_usage_perc{model_name="b"} 0.75
`,
			want: Snapshot{Waiting: 3.5, Running: 10, KVUsage: 0.75},
		},
		{
			name: "new names win over deprecated ones", engine: EngineVLLM,
			in: `vllm:kv_cache_usage_perc{` + m + `} 0.5
vllm:gpu_cache_usage_perc{` + m + `} 0.9
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{` + m + `} 10
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{` + m + `} 40
# TYPE vllm:gpu_prefix_cache_hits_total counter
vllm:gpu_prefix_cache_hits_total{` + m + `} 99
# TYPE vllm:gpu_prefix_cache_queries_total counter
vllm:gpu_prefix_cache_queries_total{` + m + `} 100
`,
			want: Snapshot{KVUsage: 0.5, PrefixHits: 10, PrefixQueries: 40, CacheHitRate: 0.25},
		},
		{
			name: "new counters at zero still win", engine: EngineVLLM,
			in: `vllm:num_requests_waiting 0
vllm:prefix_cache_hits_total 0
vllm:prefix_cache_queries_total 0
vllm:gpu_prefix_cache_hits_total 5
vllm:gpu_prefix_cache_queries_total 9
`,
			want: Snapshot{},
		},
		{
			name: "half a counter pair is ignored", engine: EngineVLLM,
			in:   "vllm:num_requests_running 1\nvllm:prefix_cache_hits_total 5\n",
			want: Snapshot{Running: 1},
		},
		{
			name: "V0 hit-rate gauge", engine: EngineVLLM,
			in:   "vllm:gpu_cache_usage_perc 0.1\nvllm:gpu_prefix_cache_hit_rate 0.4\n",
			want: Snapshot{KVUsage: 0.1, CacheHitRate: 0.4},
		},
		{
			name: "cache_config_info None blocks and junk", engine: EngineVLLM,
			in: `vllm:num_requests_running 1
vllm:cache_config_info{block_size="32",num_gpu_blocks="None",engine="0"} 1
vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="1"} 1
vllm:cache_config_info{block_size="-16",num_gpu_blocks="100",engine="2"} 1
vllm:cache_config_info{block_size="16",num_gpu_blocks="99999999999999999999",engine="3"} 1
vllm:cache_config_info{block_size="16",num_gpu_blocks="9007199254740992",engine="4"} 1
`,
			want: Snapshot{Running: 1, BlockSize: 32, KVCapacityTokens: 1600},
		},
		{
			name: "bad samples skipped, usage clamped", engine: EngineVLLM,
			in: `vllm:num_requests_waiting{a="1"} NaN
vllm:num_requests_waiting{a="2"} -3
vllm:num_requests_waiting{a="3"} +Inf
vllm:num_requests_waiting{a="4"} 2
vllm:num_requests_running{a="1"} -Inf
vllm:kv_cache_usage_perc{a="1"} 1.7
`,
			want: Snapshot{Waiting: 2, KVUsage: 1},
		},
		{
			name: "sum overflow is an error", engine: EngineVLLM,
			in:      "vllm:num_requests_waiting{a=\"1\"} 1.7e308\nvllm:num_requests_waiting{a=\"2\"} 1.7e308\n",
			wantErr: errAny,
		},
		{
			name: "histogram under an expected name is ignored", engine: EngineVLLM,
			in: `# TYPE vllm:num_requests_waiting histogram
vllm:num_requests_waiting_bucket{le="+Inf"} 3
vllm:num_requests_waiting_count 3
vllm:num_requests_waiting_sum 3
vllm:num_requests_running 1
`,
			want: Snapshot{Running: 1},
		},
		{
			name: "sglang with token counters and dp ranks", engine: EngineSGLang,
			in: `# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{` + m + `,dp_rank="0"} 3
sglang:num_queue_reqs{` + m + `,dp_rank="1"} 4
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{` + m + `,dp_rank="0"} 10
sglang:num_running_reqs{` + m + `,dp_rank="1"} 11
# TYPE sglang:token_usage gauge
sglang:token_usage{` + m + `,dp_rank="0"} 0.6
sglang:token_usage{` + m + `,dp_rank="1"} 0.2
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{` + m + `,dp_rank="0"} 1000
sglang:max_total_num_tokens{` + m + `,dp_rank="1"} 1000
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{` + m + `,dp_rank="0"} 0.5
sglang:cache_hit_rate{` + m + `,dp_rank="1"} 0.25
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{` + m + `,cache_source="device"} 300
sglang:cached_tokens_total{` + m + `,cache_source="host"} 100
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{` + m + `} 1000
`,
			want: Snapshot{
				Waiting: 7, Running: 21, KVUsage: 0.6, KVCapacityTokens: 2000, BlockSize: 1,
				PrefixHits: 400, PrefixQueries: 1000, CacheHitRate: 0.375,
			},
		},
		{
			name: "sglang without hit-rate gauge uses counters", engine: EngineSGLang,
			in:   "sglang:num_queue_reqs 0\nsglang:cached_tokens_total 1\nsglang:prompt_tokens_total 4\n",
			want: Snapshot{BlockSize: 1, PrefixHits: 1, PrefixQueries: 4, CacheHitRate: 0.25},
		},
		{
			name: "sglang absurd capacity ignored", engine: EngineSGLang,
			in:   "sglang:num_queue_reqs 0\nsglang:max_total_num_tokens 1e300\n",
			want: Snapshot{BlockSize: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseMetrics(strings.NewReader(tt.in), tt.engine)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tt.wantErr != nil && err == nil:
				t.Fatalf("want error, got %+v", got)
			case tt.wantErr != nil && !errors.Is(tt.wantErr, errAny) && !errors.Is(err, tt.wantErr):
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			case err != nil:
				if got != (Snapshot{}) {
					t.Errorf("non-zero snapshot with error: %+v", got)
				}
				return
			}
			if got != tt.want {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

func TestParseMetricsNilReader(t *testing.T) {
	if _, err := ParseMetrics(nil, EngineVLLM); err == nil {
		t.Fatal("want error for nil reader")
	}
}

// checkSane asserts the invariants every successfully parsed snapshot holds.
func checkSane(t testing.TB, s Snapshot) {
	t.Helper()
	finiteNonNeg := func(name string, v float64) {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			t.Fatalf("%s = %v, want finite and >= 0 (%+v)", name, v, s)
		}
	}
	finiteNonNeg("Waiting", s.Waiting)
	finiteNonNeg("Running", s.Running)
	finiteNonNeg("PrefixHits", s.PrefixHits)
	finiteNonNeg("PrefixQueries", s.PrefixQueries)
	if !(s.KVUsage >= 0 && s.KVUsage <= 1) {
		t.Fatalf("KVUsage = %v, want 0..1", s.KVUsage)
	}
	if !(s.CacheHitRate >= 0 && s.CacheHitRate <= 1) {
		t.Fatalf("CacheHitRate = %v, want 0..1", s.CacheHitRate)
	}
	if s.KVCapacityTokens < 0 || s.KVCapacityTokens > maxTokens {
		t.Fatalf("KVCapacityTokens = %d", s.KVCapacityTokens)
	}
	if s.BlockSize < 0 {
		t.Fatalf("BlockSize = %d", s.BlockSize)
	}
	if !s.At.IsZero() || s.InFlightAtScrape != 0 || s.DispatchedAtScrape != 0 {
		t.Fatalf("ParseMetrics set poller fields: %+v", s)
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"vllm_v1.txt", "vllm_old.txt", "sglang.txt"} {
		b := readTestdata(f, name)
		f.Add(b, false)
		f.Add(b, true)
		// Each metric family alone as well: small seeds mutate and minimise
		// far faster than the whole 30 KiB files.
		sglang := strings.HasPrefix(name, "sglang")
		for fam := range strings.SplitSeq(string(b), "\n# HELP ") {
			f.Add([]byte("# HELP "+fam+"\n"), sglang)
		}
	}
	f.Add([]byte("vllm:num_requests_waiting NaN\nvllm:kv_cache_usage_perc -Inf\n"), false)
	f.Add([]byte(`vllm:cache_config_info{block_size="16",num_gpu_blocks="27000"} 1`+"\nvllm:num_requests_running 1\n"), false)
	f.Add([]byte("sglang:num_queue_reqs 1e308\nsglang:num_queue_reqs{a=\"b\"} 1e308\n"), true)
	f.Add([]byte("# TYPE x histogram\nx_bucket{le=\"1\"} 1\n"), true)
	f.Add([]byte("{\"data\":[]}"), false)
	f.Add([]byte("vllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 3\n"), false)
	f.Add([]byte("sglang:num_queue_reqs{dp_rank=\"1\"} 2\nsglang:token_usage{dp_rank=\"0\"} 0.5\n"), true)
	f.Fuzz(func(t *testing.T, data []byte, sglang bool) {
		engine := EngineVLLM
		if sglang {
			engine = EngineSGLang
		}
		s, err := ParseMetrics(strings.NewReader(string(data)), engine)
		if err != nil {
			if s != (Snapshot{}) {
				t.Fatalf("non-zero snapshot with error %v: %+v", err, s)
			}
			return
		}
		checkSane(t, s)
		// One rank's series are a subset of all: sums and maxima no larger.
		for rank := range 2 {
			r, err := ParseRankMetrics(strings.NewReader(string(data)), engine, rank)
			if err != nil {
				continue
			}
			checkSane(t, r)
			if r.Waiting > s.Waiting || r.Running > s.Running || r.KVUsage > s.KVUsage || r.KVCapacityTokens > s.KVCapacityTokens {
				t.Fatalf("rank %d reads more than the whole server: %+v of %+v", rank, r, s)
			}
		}
	})
}

func BenchmarkParseMetricsVLLM(b *testing.B) {
	data := string(readTestdata(b, "vllm_v1.txt"))
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := ParseMetrics(strings.NewReader(data), EngineVLLM); err != nil {
			b.Fatal(err)
		}
	}
}
