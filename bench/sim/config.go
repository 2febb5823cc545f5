package sim

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// BytesPerToken is the sim's tokenizer: a text of n bytes counts as
// ceil(n/BytesPerToken) tokens. A token id in a completions prompt array
// counts as one token and is encoded as BytesPerToken bytes.
const BytesPerToken = 4

// DefaultPreset is the preset used when Config.Preset is empty.
const DefaultPreset = "llama-8b-h100"

// Config configures one simulated replica.
//
// NewReplica starts from the preset named by Preset (DefaultPreset when
// empty) and replaces every zero field with the preset's value, so
// Config{Preset: "qwen-32b-2xh100", TimeScale: 0.1} is a complete config. A
// cost field (the *Ms fields and CachedTokenFrac) set to a negative value
// means zero, and so does a negative HostBlocks (no host tier, even on a
// preset that has one).
//
// The step cost model, in simulated milliseconds, for one engine step that
// decodes the set D of sequences and prefills the set P of chunks is
//
//	step = StepBaseMs
//	     + Σ_{d∈D} (DecodeSeqMs + DecodeCtxMs·ctx_d)
//	     + Σ_{p∈P} (PrefillTokenMs·e_p + PrefillCtxMs·c_p + PrefillAttnMs·e_p·(c_p + e_p/2))
//	     + CachedTokenFrac·PrefillTokenMs·(prefix-cache hit tokens of requests admitted this step)
//	     + HostLoadTokenMs·(host-tier hit tokens of requests admitted this step)
//
// where ctx_d is the context length (prompt + generated tokens) of a decoding
// sequence, e_p the number of tokens of a prefill chunk and c_p the number of
// tokens of that request already in KV (GPU cache hits, host-tier hits loaded
// at admission and earlier chunks). The
// e·(c+e/2) term is the attention work of the chunk (each of its tokens
// attends to on average c+e/2 earlier tokens). Real (wall-clock) time is the
// simulated time multiplied by TimeScale.
type Config struct {
	// Name names the replica (response ids, Stats). Default "sim".
	Name string
	// Model is the served model name (/v1/models; a request naming another
	// model gets 404). Default from the preset, e.g. "sim-llama-8b".
	Model string
	// Preset names the cost preset (see Presets). Default DefaultPreset.
	Preset string
	// TimeScale multiplies every simulated duration: 0.1 runs ten times
	// faster than the modelled hardware. Zero or negative means 1.
	TimeScale float64

	// BlockSize is the KV block size in tokens (vLLM default 16).
	BlockSize int
	// NumGPUBlocks is the KV cache capacity in blocks.
	NumGPUBlocks int
	// MaxNumSeqs bounds the number of running requests (vLLM default 256).
	MaxNumSeqs int
	// MaxBatchedTokens is the per-step token budget shared by decode and
	// chunked prefill (vLLM max_num_batched_tokens).
	MaxBatchedTokens int
	// MaxModelLen bounds prompt + max_tokens; longer requests get 400.
	MaxModelLen int
	// DefaultMaxTokens is max_tokens when a request gives none (capped at
	// MaxModelLen - prompt tokens).
	DefaultMaxTokens int
	// WatermarkFrac is the share of blocks kept free when admitting a request
	// while others run (vLLM's watermark), to avoid immediate preemption.
	WatermarkFrac float64

	// StepBaseMs is the fixed cost of a non-empty step (weight reads,
	// scheduling, sampling).
	StepBaseMs float64
	// DecodeSeqMs is the cost per decoding sequence in a step.
	DecodeSeqMs float64
	// DecodeCtxMs is the cost per context token of a decoding sequence
	// (KV reads).
	DecodeCtxMs float64
	// PrefillTokenMs is the cost per uncached prompt token computed.
	PrefillTokenMs float64
	// PrefillCtxMs is the cost per context token already in KV before a
	// prefill chunk (Preble's c term).
	PrefillCtxMs float64
	// PrefillAttnMs is the cost per unit of e·(c+e/2) of a prefill chunk.
	PrefillAttnMs float64
	// CachedTokenFrac is the cost of a prefix-cache hit token as a fraction
	// of PrefillTokenMs (about 0.03).
	CachedTokenFrac float64

	// HostBlocks is the capacity, in blocks of BlockSize tokens, of a second
	// KV tier in host (CPU) memory, as with vLLM's CPU offloading connector,
	// LMCache or SGLang HiCache. Every prompt block registered in the GPU
	// cache is also written to it (write-through, LRU eviction); at
	// admission the leading run of prompt blocks missed on GPU continues in
	// the host tier, and those blocks are loaded into fresh GPU blocks at
	// HostLoadTokenMs per token instead of being prefilled. Default from the
	// preset: 0 (no host tier) except for "llama-8b-h100-offload"; negative
	// means no host tier.
	HostBlocks int
	// HostLoadTokenMs is the cost per host-tier hit token of loading it into
	// GPU KV (PCIe transfer), charged in the step that admits the request.
	// Default from the preset (0.005 ms, ~128 KiB per token per GPU at
	// ~25 GB/s); it matters only when HostBlocks is positive.
	HostLoadTokenMs float64

	// StreamFlushInterval, when positive, is the minimum real time between
	// two writes to one streaming response: tokens produced in between are
	// sent together (still one SSE event per token, one socket write). Zero
	// writes after every engine step that produced tokens for the request;
	// even then a slow reader gets several tokens per write.
	StreamFlushInterval time.Duration

	// KVEvents makes the replica publish its KV cache events as vLLM does
	// with --kv-events-config (see KVEventsEndpoints): a BlockStored for
	// every run of blocks a request newly stores, a BlockRemoved for every
	// eviction, an AllBlocksCleared for a prefix-cache reset, in batches of
	// one engine step or more, over ZMQ PUB on 127.0.0.1 with a ROUTER
	// replay socket beside it.
	KVEvents bool
	// KVEventsEncoding is the events' msgpack encoding: "positional"
	// (arrays, vLLM before it tagged its events; the default) or "tagged"
	// (maps with a "type" key).
	KVEventsEncoding string
	// KVEventsPort and KVEventsReplayPort are the 127.0.0.1 ports of the
	// event publisher and of its replay socket; 0 picks a free port, and a
	// negative KVEventsReplayPort serves no replay. StartFleet gives
	// replica i each port plus i, as vLLM gives data-parallel rank r.
	KVEventsPort, KVEventsReplayPort int
	// KVEventsTopic is the topic frame of every event message (vLLM's
	// default is empty).
	KVEventsTopic string
	// DataParallelSize, when above 1, makes StartFleet serve that many
	// engines (ranks) behind each replica's one HTTP port, as vLLM's
	// --data-parallel-size behind one API server (see rankGroup). Default 1.
	DataParallelSize int
	// DataParallelRank is the engine's data-parallel rank: the engine label
	// of its metrics and the dp_rank of its event batches. StartFleet sets
	// it for each rank. Default 0.
	DataParallelRank int
	// KVEventsKeep is how many batches the replay socket keeps (vLLM keeps
	// 10,000, the default). A kept batch holds its encoded events, about
	// 5 bytes per token of the blocks it stored: lower it for long runs
	// of many replicas in one process.
	KVEventsKeep int

	// Role is the replica's part in a disaggregated fleet, as
	// backends[].role: "prefill", "decode", or "" / "both". It decides
	// nothing by itself (every replica serves every request, as an engine
	// with a kv_both connector does); the wire fields decide: a request
	// with kv_transfer_params.do_remote_decode (vLLM) or a bootstrap_room
	// sent to a prefill replica (SGLang) is prefilled and answered with
	// one token, its KV kept for the decode replica; one with
	// kv_transfer_params.do_remote_prefill (vLLM) or a bootstrap_room sent
	// to a decode replica (SGLang) receives its prompt's KV instead of
	// computing it (TransferTokenMs per token it does not hold).
	// StartRoleFleet sets it per replica.
	Role string
	// TransferTokenMs is the cost per prompt token of receiving a prompt's
	// KV cache from a prefill replica. Default 0.0026 ms: 128 KiB of KV
	// per token (Llama-3.1-8B) at 50 GB/s, within what Mooncake's transfer
	// engine reports over RDMA (87 GB/s on 4×200 Gbps RoCE, 190 GB/s on
	// 8×400 Gbps; Mooncake, FAST '25); about a tenth of a prefilled
	// token's cost.
	TransferTokenMs float64
}

// llama8bH100 is the "llama-8b-h100" preset: Llama-3.1-8B, BF16, one H100
// 80 GB (vLLM, TP1).
//
// Prefill: PrefillTokenMs 0.028 ms/token (~35.7k tokens/s of pure
// linear work) plus attention PrefillAttnMs 2e-6 ms per token·context,
// plus the 7 ms step base: a 2k-token cold prompt is one 68 ms step
// (~30k tokens/s), an 8k chunk 303 ms (~27k tokens/s), a 20k prompt
// three chunks, ~0.98 s (~20k tokens/s). A cached token costs 3 % of an
// uncached one.
//
// Decode: 7.0 ms base (16 GB of weights at 3.35 TB/s is 4.8 ms, plus
// overhead) + 0.03 ms per sequence + 3.9e-5 ms per context token
// (128 KiB of KV per token at 3.35 TB/s): 1 seq × 1k context is 7.1 ms,
// 64 seqs × 2k is 14.0 ms, 64 × 4k is 19.1 ms.
//
// KV: 25,000 blocks × 16 = 400,000 tokens (128 KiB per token: 32 layers ×
// 8 KV heads × 128 dims × K and V × 2 bytes). No host tier; HostLoadTokenMs
// 0.005 ms/token (128 KiB over ~25 GB/s of effective PCIe Gen5 x16 is
// ~5.2 µs) applies when HostBlocks is set.
var llama8bH100 = Config{
	Model:            "sim-llama-8b",
	BlockSize:        16,
	NumGPUBlocks:     25000,
	MaxNumSeqs:       256,
	MaxBatchedTokens: 8192,
	MaxModelLen:      131072,
	DefaultMaxTokens: 256,
	WatermarkFrac:    0.01,
	StepBaseMs:       7.0,
	DecodeSeqMs:      0.03,
	DecodeCtxMs:      3.9e-5,
	PrefillTokenMs:   0.028,
	PrefillCtxMs:     0,
	PrefillAttnMs:    2e-6,
	CachedTokenFrac:  0.03,
	HostLoadTokenMs:  0.005,
	TransferTokenMs:  0.0026,
}

// presets holds the named cost presets; llama8bH100 derives its numbers.
var presets = map[string]Config{
	// Llama-3.1-8B, BF16, one H100 80 GB (vLLM, TP1); see llama8bH100.
	"llama-8b-h100": llama8bH100,
	// "llama-8b-h100" with CPU KV offloading (vLLM's offloading connector
	// or LMCache, SGLang HiCache): a host tier of 2,000,000 tokens =
	// 125,000 blocks of 16. At 128 KiB of KV per token that is 256 GB of
	// host DRAM per GPU, 2 TB for the 8 GPUs of an 8×H100 node with 2 TB of
	// RAM. Loading a host hit into GPU KV costs HostLoadTokenMs =
	// 0.005 ms/token (128 KiB over ~25 GB/s of effective PCIe Gen5 x16 is
	// ~5 µs): about 18 % of the 0.028 ms of a prefilled token, against 3 %
	// for a GPU prefix-cache hit. Everything else is "llama-8b-h100".
	"llama-8b-h100-offload": withHostTier(llama8bH100, 2_000_000/16),
	// Qwen3-32B, BF16, two H100 80 GB (vLLM, TP2).
	//
	// Prefill: Preble's fit for Llama-3-70B on 2×H100,
	//   18.67 + 0.0799·e + 0.002685·c + 7.44e-7·e·c  (ms),
	// scaled to Qwen3-32B: the per-token term by parameter count
	// (32.8B/70.6B = 0.465 → 0.0371 ms/token), the context and attention
	// terms by layers × attention width and KV bytes (64 vs 80 layers, same
	// 8192-wide attention, 256 vs 320 KiB/token → 0.8: 0.00215 and 5.95e-7),
	// and the fixed term folded into a 12 ms step base. A 2k-token cold
	// prompt is an 89 ms step (~23k tokens/s); 8k ~330 ms.
	//
	// Decode: 12 ms base (64 GB of weights over 2 GPUs at 3.35 TB/s is
	// 9.8 ms, plus all-reduce and overhead) + 0.06 ms per sequence +
	// 3.9e-5 ms per context token (256 KiB/token over 2 GPUs): 1 seq is
	// ~12 ms, 64 seqs × 3k is 23.3 ms.
	//
	// KV: 19,208 blocks × 16 = 307,328 tokens (measured by llm-d). No host
	// tier; HostLoadTokenMs 0.005 ms/token when HostBlocks is set (each GPU
	// loads its 128 KiB half of a token's 256 KiB over its own PCIe link at
	// ~25 GB/s). TransferTokenMs 0.0052 ms: 256 KiB per token at 50 GB/s.
	"qwen-32b-2xh100": {
		Model:            "sim-qwen-32b",
		BlockSize:        16,
		NumGPUBlocks:     19208,
		MaxNumSeqs:       256,
		MaxBatchedTokens: 8192,
		MaxModelLen:      131072,
		DefaultMaxTokens: 256,
		WatermarkFrac:    0.01,
		StepBaseMs:       12.0,
		DecodeSeqMs:      0.06,
		DecodeCtxMs:      3.9e-5,
		PrefillTokenMs:   0.0371,
		PrefillCtxMs:     0.00215,
		PrefillAttnMs:    5.95e-7,
		CachedTokenFrac:  0.03,
		HostLoadTokenMs:  0.005,
		TransferTokenMs:  0.0052,
	},
}

// withHostTier returns preset p with a host tier of blocks blocks.
func withHostTier(p Config, blocks int) Config {
	p.HostBlocks = blocks
	return p
}

// Presets returns the names of the cost presets, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PresetConfig returns the complete Config of a named preset (TimeScale 1,
// Name "sim").
func PresetConfig(name string) (Config, error) {
	p, ok := presets[name]
	if !ok {
		return Config{}, fmt.Errorf("sim: unknown preset %q (have %v)", name, Presets())
	}
	p.Preset = name
	p.Name = "sim"
	p.TimeScale = 1
	return p, nil
}

// resolve fills the zero fields of c from its preset and validates it.
func (c Config) resolve() (Config, error) {
	name := c.Preset
	if name == "" {
		name = DefaultPreset
	}
	p, err := PresetConfig(name)
	if err != nil {
		return Config{}, err
	}
	if c.Name == "" {
		c.Name = p.Name
	}
	if c.Model == "" {
		c.Model = p.Model
	}
	c.Preset = name
	if c.TimeScale <= 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) {
		c.TimeScale = 1
	}
	ints := []struct{ v, d *int }{
		{&c.BlockSize, &p.BlockSize},
		{&c.NumGPUBlocks, &p.NumGPUBlocks},
		{&c.MaxNumSeqs, &p.MaxNumSeqs},
		{&c.MaxBatchedTokens, &p.MaxBatchedTokens},
		{&c.MaxModelLen, &p.MaxModelLen},
		{&c.DefaultMaxTokens, &p.DefaultMaxTokens},
	}
	if c.HostBlocks == 0 {
		c.HostBlocks = p.HostBlocks
	}
	if c.HostBlocks < 0 {
		c.HostBlocks = 0 // explicitly no host tier
	}
	for _, f := range ints {
		if *f.v == 0 {
			*f.v = *f.d
		}
		if *f.v < 0 {
			return Config{}, fmt.Errorf("sim: negative size in config")
		}
	}
	floats := []struct{ v, d *float64 }{
		{&c.WatermarkFrac, &p.WatermarkFrac},
		{&c.StepBaseMs, &p.StepBaseMs},
		{&c.DecodeSeqMs, &p.DecodeSeqMs},
		{&c.DecodeCtxMs, &p.DecodeCtxMs},
		{&c.PrefillTokenMs, &p.PrefillTokenMs},
		{&c.PrefillCtxMs, &p.PrefillCtxMs},
		{&c.PrefillAttnMs, &p.PrefillAttnMs},
		{&c.CachedTokenFrac, &p.CachedTokenFrac},
		{&c.HostLoadTokenMs, &p.HostLoadTokenMs},
		{&c.TransferTokenMs, &p.TransferTokenMs},
	}
	for _, f := range floats {
		if *f.v == 0 {
			*f.v = *f.d
		}
		if *f.v < 0 || math.IsNaN(*f.v) {
			*f.v = 0
		}
	}
	if err := c.resolveKVEvents(); err != nil {
		return Config{}, err
	}
	if c.WatermarkFrac >= 1 {
		return Config{}, fmt.Errorf("sim: WatermarkFrac %v must be < 1", c.WatermarkFrac)
	}
	return c, nil
}

// PrefillTime is the unscaled simulated duration of one step that only
// prefills a chunk of e uncached tokens of a request with c tokens already in
// KV, of which hit tokens were prefix-cache hits charged in this step. It
// fills zero fields from the preset like NewReplica.
func (c Config) PrefillTime(e, ctx, hit int) time.Duration {
	rc, err := c.resolve()
	if err != nil {
		return 0
	}
	return msDur(rc.StepBaseMs + rc.prefillMs(e, ctx) + rc.cachedMs(hit))
}

// DecodeStepTime is the unscaled simulated duration of one pure decode step
// of seqs sequences holding ctxTokens context tokens in total. It fills zero
// fields from the preset like NewReplica.
func (c Config) DecodeStepTime(seqs, ctxTokens int) time.Duration {
	rc, err := c.resolve()
	if err != nil || seqs <= 0 {
		return 0
	}
	return msDur(rc.StepBaseMs + float64(seqs)*rc.DecodeSeqMs + float64(ctxTokens)*rc.DecodeCtxMs)
}

func (c *Config) prefillMs(e, ctx int) float64 {
	fe, fc := float64(e), float64(ctx)
	return c.PrefillTokenMs*fe + c.PrefillCtxMs*fc + c.PrefillAttnMs*fe*(fc+fe/2)
}

// chunkMs is the cost of n prompt tokens of q in a step: computed, or
// received from a prefill replica when q is remote.
func (c *Config) chunkMs(q *request, n int) float64 {
	if q.remote {
		return c.TransferTokenMs * float64(n)
	}
	return c.prefillMs(n, q.computed)
}

func (c *Config) cachedMs(hit int) float64 {
	return c.CachedTokenFrac * c.PrefillTokenMs * float64(hit)
}

// hostLoadMs is the cost of loading hit host-tier tokens into GPU KV.
func (c *Config) hostLoadMs(hit int) float64 {
	return c.HostLoadTokenMs * float64(hit)
}

func msDur(ms float64) time.Duration {
	return time.Duration(ms * float64(time.Millisecond))
}
