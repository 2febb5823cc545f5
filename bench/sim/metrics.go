package sim

import (
	"net/http"
	"strconv"
	"strings"
)

// serveMetrics writes vLLM's metric names in the Prometheus text format
// (0.0.4). Every sample carries model_name and engine labels, as vLLM v1
// does (engine is the data-parallel rank, 0 alone). The prefix_cache
// counters are GPU hits only; with a host tier its hits are the
// external_prefix_cache counters (vLLM's names for hits served by a KV
// connector), and cache_config_info's num_cpu_blocks is its capacity.
func (r *Replica) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	writeMetrics(w, []*Replica{r})
}

// rankMetrics is what one engine reports.
type rankMetrics struct {
	r            *Replica
	st           Stats
	stop, length int64
	labels       string
}

// writeMetrics writes the metrics of ranks, the engines behind one
// server: each family once, with every rank's sample.
func writeMetrics(w http.ResponseWriter, ranks []*Replica) {
	ms := make([]rankMetrics, len(ranks))
	host := false
	for i, r := range ranks {
		m := &ms[i]
		m.r, m.st = r, r.Stats()
		r.mu.Lock()
		m.stop, m.length = r.c.finishedStop, r.c.finishedLength
		r.mu.Unlock()
		m.labels = `engine="` + strconv.Itoa(r.cfg.DataParallelRank) + `",model_name="` + escapeLabel(r.cfg.Model) + `"`
		host = host || m.st.HostBlocks > 0
	}
	var b strings.Builder
	b.Grow(4096 * len(ms))
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
	sample := func(m *rankMetrics, name, extra string, v float64) {
		b.WriteString(name)
		b.WriteByte('{')
		b.WriteString(m.labels)
		if extra != "" {
			b.WriteByte(',')
			b.WriteString(extra)
		}
		b.WriteString("} ")
		b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
		b.WriteByte('\n')
	}
	metric := func(name, typ, help string, v func(st *Stats) float64) {
		family(name, typ, help)
		for i := range ms {
			sample(&ms[i], name, "", v(&ms[i].st))
		}
	}

	family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig.")
	for i := range ms {
		m := &ms[i]
		c := &m.r.cfg
		sample(m, "vllm:cache_config_info",
			`block_size="`+strconv.Itoa(c.BlockSize)+`",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="`+strconv.Itoa(m.st.HostBlocks)+`",num_gpu_blocks="`+strconv.Itoa(c.NumGPUBlocks)+`",sim_preset="`+escapeLabel(c.Preset)+`"`,
			1)
	}
	metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", func(st *Stats) float64 { return float64(st.Running) })
	metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", func(st *Stats) float64 { return float64(st.Waiting) })
	metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", func(st *Stats) float64 { return st.KVUsage })
	metric("vllm:gpu_cache_usage_perc", "gauge", "GPU KV-cache usage (pre-v1 name). 1 means 100 percent usage.", func(st *Stats) float64 { return st.KVUsage })
	metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", func(st *Stats) float64 { return float64(st.QueryTokens) })
	metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", func(st *Stats) float64 { return float64(st.HitTokens) })
	if host {
		metric("vllm:external_prefix_cache_queries_total", "counter", "External prefix cache queries from the KV connector (host-memory KV tier), in terms of number of queried tokens.", func(st *Stats) float64 { return float64(st.HostQueryTokens) })
		metric("vllm:external_prefix_cache_hits_total", "counter", "External prefix cache hits from the KV connector (host-memory KV tier), in terms of number of cached tokens.", func(st *Stats) float64 { return float64(st.HostHitTokens) })
	}
	metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", func(st *Stats) float64 { return float64(st.Preemptions) })
	metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", func(st *Stats) float64 { return float64(st.PromptTokens) })
	metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", func(st *Stats) float64 { return float64(st.GeneratedTokens) })
	family("vllm:request_success_total", "counter", "Count of successfully processed requests.")
	for i := range ms {
		sample(&ms[i], "vllm:request_success_total", `finished_reason="length"`, float64(ms[i].length))
		sample(&ms[i], "vllm:request_success_total", `finished_reason="stop"`, float64(ms[i].stop))
	}

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
