// Package load is kvroute's load generator: it builds deterministic
// workloads of OpenAI chat-completion requests and replays them open loop
// against any OpenAI-compatible endpoint (kvroute, a vLLM or SGLang
// replica, or the bench/sim replicas), measuring time to first token,
// end-to-end latency, tokens, errors and the replica that served each
// request.
//
// # Workloads
//
// A Workload is a list of Requests with arrival offsets. The generators are
// deterministic: the same options (and seed) give the same requests, byte
// for byte.
//
//   - Mooncake replays the Mooncake FAST'25 conversation trace. The trace
//     has 512-token block hashes instead of text; each hash ID becomes a
//     fixed block of synthetic text derived from the ID alone, so requests
//     that share IDs share exact text prefixes.
//   - MultiTurn: users sharing a few long system prompts, holding
//     multi-turn sessions whose context grows turn by turn.
//   - HotPrefix: one hot prefix carrying a share of the traffic, the rest
//     unique.
//   - NoReuse: unique prompts only (optionally with lengths and arrivals
//     from the Azure LLM inference trace).
//   - The rest of the workload family (family.go): Tenants (each tenant's
//     sessions sharing its long system prompt), Agentic (coding sessions
//     whose context grows from about 12k to about 80k tokens), FewShot
//     (one-shots sharing a few long few-shot prefixes), RAG (a system
//     prompt, one of a set of shared documents, a unique question),
//     Sequential (one user at a time) and Bursts.
//   - Noisy: two tenants sending unique one-shots, a victim at a steady
//     rate and an aggressor flooding in the middle of the run; each
//     request carries its tenant (Request.Tenant), sent in a header and
//     kept in its Sample.
//
// IdealHitRate gives the prefix-cache hit rate of a workload on one server
// with an infinite cache: the upper bound a router can reach. bench/oracle
// computes it too, beside the finite-cache bound over a fleet.
//
// # Synthetic text
//
// All synthetic text is made of words drawn by a seeded PRNG from a fixed
// vocabulary of 128 common three-letter English words, each written with a
// leading space (" the", " and", ...). Every word is 4 bytes and one token,
// both for the bench/sim replica (which counts 4 bytes per token) and for
// BPE tokenizers such as cl100k_base (where each such word is a single
// token). So n tokens of synthetic text are exactly 4n bytes, and a
// 512-token Mooncake block is exactly 2048 bytes. Role markers and message
// framing add a few tokens on top; see Request.PromptTokens.
//
// # Driver
//
// Run fires each request at its arrival offset regardless of how many are
// still running (open loop); only a request with DependsOn >= 0 (the next
// turn of a session) waits for the turn it depends on, plus its think time.
// Requests are sent as streaming chat completions with ignore_eos, and the
// server-sent event stream is parsed for the first content token, the
// token count, usage (including cached prompt tokens) and errors.
//
// The package deliberately imports nothing from kvroute's tokenizer, radix
// tree or router: it measures them.
package load
