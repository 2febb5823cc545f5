// Package sim is a simulated vLLM replica for benchmarking and testing
// kvroute without GPUs.
//
// A Replica serves the subset of vLLM's OpenAI-compatible HTTP API that a
// router sees (POST /v1/chat/completions, POST /v1/completions, GET
// /v1/models, GET /health, GET /metrics; vLLM's render endpoints POST
// /v1/chat/completions/render, /v1/completions/render and /tokenize, which
// return a request's token ids, TokenIDs of the replica's own rendering;
// POST /reset_prefix_cache) and runs a small discrete model of vLLM's
// engine behind it:
//
//   - Tokens are tokenizer-free: a text of n bytes is ceil(n/4) tokens (see
//     BytesPerToken); token-id arrays count one token per id. The prompt is
//     cut into blocks of BlockSize tokens (BlockSize*4 bytes) and every whole
//     block gets a chained key (hash of the parent key and the block bytes),
//     like vLLM's block hashes. Nothing here is shared with kvroute's own
//     tokenizer or radix tree: the package imports nothing else from the
//     module, so a router cannot be right by construction.
//   - A paged prefix cache of NumGPUBlocks blocks: a request hits only the
//     unbroken leading run of cached whole blocks (and, as in vLLM, never its
//     last prompt token); blocks of running requests are pinned; unpinned
//     cached blocks are evicted least-recently-used first. As in vLLM, the
//     blocks of generated tokens are cached too: when a request finishes,
//     the whole blocks of its prompt followed by its answer (for chat, the
//     answer rendered as the next turn's assistant message) are keyed, so
//     the next turn of a conversation that carries the answer back hits
//     them. The answer is deterministic (AnswerText, ChatAnswerText,
//     CompletionTokens), so load generators and oracles can reproduce it.
//   - Optionally (Config.HostBlocks, preset "llama-8b-h100-offload") a second
//     KV tier in host memory, as with vLLM's CPU offloading or LMCache: an
//     LRU set of block keys written through from the GPU cache. At admission
//     the leading run of hits continues there; those blocks are loaded into
//     fresh GPU blocks at Config.HostLoadTokenMs per token instead of being
//     prefilled, and reported as vLLM's external_prefix_cache counters.
//   - Optionally (Config.KVEvents) vLLM's KV cache events: BlockStored for
//     the runs of blocks a request newly caches (the block keys as engine
//     hashes, the blocks' token ids), BlockRemoved for evictions (medium
//     "GPU", or "CPU" for the host tier), AllBlocksCleared for a reset,
//     published in batches over ZMQ with a replay socket
//     (Replica.KVEventsEndpoints), with ways to cut the stream for a while
//     (Replica.CutKVEvents) and to look restarted (Replica.RestartKVEvents).
//   - A continuous-batching engine loop (one goroutine per replica) with at
//     most MaxNumSeqs running requests, a per-step token budget
//     (MaxBatchedTokens) shared by decodes (1 token each, scheduled first)
//     and chunked prefill (FIFO), a FIFO waiting queue with admission control
//     by KV space, and recompute preemption when decode runs out of blocks.
//   - Each step sleeps for a duration computed from a cost model (see Config
//     and the presets), multiplied by Config.TimeScale.
//   - In a fleet (StartFleet), each request notes as it arrives how much of
//     its prompt its replica holds and the most any replica of the fleet
//     holds (Stats.ArrivalHeldTokens, ArrivalBestTokens): what a router
//     that knew every cache could have found for it.
//
// Handler returns a plain net/http Handler; Serve runs it on a listener;
// StartFleet starts n replicas on 127.0.0.1.
package sim
