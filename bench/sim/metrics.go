package sim

import (
	"net/http"
	"strconv"
	"strings"
)

// serveMetrics writes vLLM's metric names in the Prometheus text format
// (0.0.4). Every sample carries model_name and engine="0" labels, as vLLM
// v1 does. The prefix_cache counters are GPU hits only; with a host tier
// its hits are the external_prefix_cache counters (vLLM's names for hits
// served by a KV connector), and cache_config_info's num_cpu_blocks is its
// capacity.
func (r *Replica) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	st := r.Stats()
	r.mu.Lock()
	stop, length := r.c.finishedStop, r.c.finishedLength
	r.mu.Unlock()

	labels := `engine="0",model_name="` + escapeLabel(r.cfg.Model) + `"`
	var b strings.Builder
	b.Grow(4096)
	family := func(name, typ, help string) {
		b.WriteString("# HELP ")
		b.WriteString(name)
		b.WriteByte(' ')
		b.WriteString(help)
		b.WriteString("\n# TYPE ")
		b.WriteString(name)
		b.WriteByte(' ')
		b.WriteString(typ)
		b.WriteByte('\n')
	}
	sample := func(name, extra string, v float64) {
		b.WriteString(name)
		b.WriteByte('{')
		b.WriteString(labels)
		if extra != "" {
			b.WriteByte(',')
			b.WriteString(extra)
		}
		b.WriteString("} ")
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		b.WriteByte('\n')
	}
	metric := func(name, typ, help string, v float64) {
		family(name, typ, help)
		sample(name, "", v)
	}

	family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.")
	sample("vllm:cache_config_info",
		`block_size="`+strconv.Itoa(r.cfg.BlockSize)+`",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="`+strconv.Itoa(st.HostBlocks)+`",num_gpu_blocks="`+strconv.Itoa(r.cfg.NumGPUBlocks)+`",sim_preset="`+escapeLabel(r.cfg.Preset)+`"`,
		1)
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", float64(st.Running))
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", float64(st.Waiting))
	metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (pre-v1 name). 1 means 100 percent usage.", st.KVUsage)
	metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", float64(st.QueryTokens))
	metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", float64(st.HitTokens))
	if st.HostBlocks > 0 {
		metric("vllm:external_prefix_cache_queries_total", "counter", "External prefix cache queries from the KV connector (host-memory KV tier), in terms of number of queried tokens.", float64(st.HostQueryTokens))
		metric("vllm:external_prefix_cache_hits_total", "counter", "External prefix cache hits from the KV connector (host-memory KV tier), in terms of number of cached tokens.", float64(st.HostHitTokens))
	}
	metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", float64(st.Preemptions))
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", float64(st.PromptTokens))
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", float64(st.GeneratedTokens))
	family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	sample("vllm:request_success_total", `finished_reason="length"`, float64(length))
	sample("vllm:request_success_total", `finished_reason="stop"`, float64(stop))

	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// escapeLabel escapes a label value for the text format.
func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, `"`, `\"`)
	return strings.ReplaceAll(s, "\n", `\n`)
}
