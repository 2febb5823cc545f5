package load

import (
	"slices"
	"time"
)

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// roleSystem, roleUser and roleAssistant are the roles of the messages a
// workload sends.
const (
	roleSystem    = "system"
	roleUser      = "user"
	roleAssistant = "assistant"
)

// Request is one request of a workload.
type Request struct {
	// At is the arrival offset from the start of the run (open loop).
	At time.Duration
	// Session is the session ID, sent as header X-Session-ID when non-empty.
	Session string
	// Tenant is who sends the request, sent as header X-Tenant when
	// non-empty (RunOptions.TenantHeader) and kept in its Sample, so that
	// a report can split the requests by tenant.
	Tenant string
	// Messages is the chat conversation sent as the request body. It may be
	// nil for a Mooncake request whose text is synthesized on demand from
	// Blocks; Chat returns the messages in either case.
	Messages []Message
	// MaxTokens is max_tokens (ignore_eos true is sent too).
	MaxTokens int
	// PromptTokens is the approximate prompt length in tokens (for reports).
	// For Mooncake it is the trace's input_length; for the synthetic
	// workloads it is the length of the canonical rendering of Messages
	// ("<|role|>content\n" per message) at 4 bytes per token.
	PromptTokens int
	// Blocks are optional ideal-reuse block identities: the Mooncake trace's
	// prefix-chained hash IDs of 512-token blocks. IdealHitRate uses them
	// when present and hashes the text otherwise.
	Blocks []uint64
	// DependsOn is the index (in Workload.Requests) of the request whose
	// answer must complete before this one is sent, or -1 for none: the
	// previous turn of a session. Such a request is sent at
	// max(At, completion of DependsOn + Think). It must be less than the
	// request's own index. Note the zero value 0 means "depends on request
	// 0": generators always set it, to -1 when there is no dependency.
	DependsOn int
	// Think is the think time between the completion of DependsOn and this
	// request.
	Think time.Duration
	// SendsAnswer makes the request carry back the answers its conversation
	// actually received, as a chat client does, in place of the workload's
	// placeholder text; the zero value false sends Messages as they are.
	// Messages must extend the messages of request AnswerOf (the previous
	// turn of the conversation) by one assistant message (the placeholder)
	// and then the new messages. Run sends, in their place, the messages it
	// sent for AnswerOf (so the answers of earlier turns are carried too),
	// then the answer AnswerOf received as the assistant message's content,
	// then the new messages; if AnswerOf received no answer (it failed), the
	// placeholder is sent. A replica that caches the blocks of generated
	// tokens (vLLM, bench/sim) then hits the previous prompt and its answer.
	// Workload.AnswerBytes tells how much of the request such a replica
	// holds (IdealHitRate counts it), taking the answer to be as long as
	// the placeholder (so it should have AnswerOf's MaxTokens tokens, which
	// Run asks for with ignore_eos).
	SendsAnswer bool
	// AnswerOf is, with SendsAnswer, the index of the earlier request whose
	// answer the request carries back; usually DependsOn, but not always
	// (a turn may wait for another conversation's request). Run sends the
	// request only once AnswerOf has completed. Ignored without
	// SendsAnswer.
	AnswerOf int
}

// Chat returns the request's chat messages. When Messages is nil and Blocks
// is set (a Mooncake request), it synthesizes the single user message whose
// content is the concatenated block texts cut to PromptTokens tokens.
func (r *Request) Chat() []Message {
	if r.Messages != nil || len(r.Blocks) == 0 {
		return r.Messages
	}
	text := appendMooncakePrompt(make([]byte, 0, r.PromptTokens*BytesPerToken), r.Blocks, r.PromptTokens)
	return []Message{{Role: roleUser, Content: string(text)}}
}

// Workload is a named, ordered list of requests.
type Workload struct {
	// Name describes the workload (for reports).
	Name string
	// Requests, in arrival order.
	Requests []Request
	// HasSessions reports whether requests carry session IDs.
	HasSessions bool
}

// DefaultHitBlockTokens is the block size IdealHitRate uses for text when
// it is given a non-positive block size: 16 tokens (64 bytes), vLLM's
// default block size.
const DefaultHitBlockTokens = 16

// IdealHitRate returns the token-weighted prefix-cache hit rate of w on one
// server with an infinite cache, with requests taken in slice (arrival)
// order: the hit tokens of all requests over their prompt tokens.
//
// A request with Blocks (Mooncake) hits the leading run of its block IDs
// seen in earlier requests; its hit tokens are min(hits*512, PromptTokens)
// and its prompt tokens PromptTokens (blockTokens is ignored: the trace's
// granularity is fixed). A request without Blocks is rendered canonically
// ("<|role|>content\n" per message, as bench/sim does) and cut into whole
// blocks of blockTokens*4 bytes, each identified by a hash chained over the
// previous block's; it hits the leading run of blocks seen before, and its
// prompt tokens are the rendering's length over 4 (rounded up). A trailing
// partial block never hits. A request with SendsAnswer also finds cached
// the whole blocks of its first AnswerBytes bytes (its previous prompt and
// the answer it carries back), as a replica that caches generated tokens
// holds them once AnswerOf has finished.
//
// On the whole Mooncake conversation trace it is 0.3736 (docs/benchmarks.md's 37.4 %
// token-weighted; 36.6 % counted in blocks).
func IdealHitRate(w *Workload, blockTokens int) float64 {
	if blockTokens <= 0 {
		blockTokens = DefaultHitBlockTokens
	}
	bb := blockTokens * BytesPerToken
	traceSeen := make(map[uint64]struct{})
	textSeen := make(map[uint64]struct{})
	var hit, total int64
	var keys []uint64
	for i := range w.Requests {
		r := &w.Requests[i]
		if len(r.Blocks) > 0 {
			n := 0
			for n < len(r.Blocks) {
				if _, ok := traceSeen[r.Blocks[n]]; !ok {
					break
				}
				n++
			}
			for _, id := range r.Blocks[n:] {
				traceSeen[id] = struct{}{}
			}
			hit += int64(min(n*MooncakeBlockTokens, r.PromptTokens))
			total += int64(r.PromptTokens)
			continue
		}
		text := renderChat(r.Messages)
		keys = chainKeys(keys[:0], text, bb)
		for _, k := range keys[:min(w.AnswerBytes(i)/bb, len(keys))] {
			textSeen[k] = struct{}{}
		}
		n := 0
		for n < len(keys) {
			if _, ok := textSeen[keys[n]]; !ok {
				break
			}
			n++
		}
		for _, k := range keys[n:] {
			textSeen[k] = struct{}{}
		}
		hit += int64(n * blockTokens)
		total += int64(tokensOf(len(text)))
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// RenderChat renders messages canonically, as bench/sim does and as
// IdealHitRate hashes them: "<|role|>" content "\n" per message.
func RenderChat(msgs []Message) string { return renderChat(msgs) }

// BlockKeys appends to dst the chained keys IdealHitRate gives the whole
// blocks of blockTokens tokens of text (a trailing partial block gets none):
// two texts share their first k keys exactly when they share their first k
// blocks.
func BlockKeys(dst []uint64, text string, blockTokens int) []uint64 {
	return chainKeys(dst, text, blockTokens*BytesPerToken)
}

// TextTokens is the token count of text under the 4-bytes-per-token rule
// (rounded up), as IdealHitRate and bench/sim count it.
func TextTokens(text string) int { return tokensOf(len(text)) }

// AnswerBytes returns, for request i with SendsAnswer, how many leading
// bytes of the canonical rendering of its messages (RenderChat) a replica
// that caches generated tokens, as vLLM and bench/sim do, holds once it has
// served AnswerOf: the rendering of the messages up to and including the
// assistant message that carries AnswerOf's answer (the answer taken as
// long as the placeholder). It is 0 for any other request. IdealHitRate
// uses it to count the answers' blocks; so can other oracles.
func (w *Workload) AnswerBytes(i int) int {
	reqs := w.Requests
	if i < 0 || i >= len(reqs) {
		return 0
	}
	r := &reqs[i]
	if !r.SendsAnswer || r.AnswerOf < 0 || r.AnswerOf >= i {
		return 0
	}
	n := len(reqs[r.AnswerOf].Messages) + 1
	if n > len(r.Messages) {
		return 0
	}
	end := 0
	for _, m := range r.Messages[:n] {
		end += len(m.Role) + len(m.Content) + len("<||>\n")
	}
	return end
}

// chainKeys appends the chained FNV-1a keys of the whole blocks of bb bytes
// of text: key_i = H(key_{i-1}, block i).
func chainKeys(dst []uint64, text string, bb int) []uint64 {
	parent := uint64(0x6c6f61642d726f6f)
	for off := 0; off+bb <= len(text); off += bb {
		h := uint64(14695981039346656037)
		for k := 0; k < 8; k++ {
			h ^= (parent >> (8 * k)) & 0xff
			h *= 1099511628211
		}
		for i := off; i < off+bb; i++ {
			h ^= uint64(text[i])
			h *= 1099511628211
		}
		dst = append(dst, h)
		parent = h
	}
	return dst
}

// sortByArrival stably sorts reqs by At and rewrites DependsOn and AnswerOf
// indices to the new positions.
func sortByArrival(reqs []Request) {
	idx := make([]int, len(reqs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		switch {
		case reqs[a].At < reqs[b].At:
			return -1
		case reqs[a].At > reqs[b].At:
			return 1
		}
		return 0
	})
	pos := make([]int, len(reqs))
	for newI, oldI := range idx {
		pos[oldI] = newI
	}
	out := make([]Request, len(reqs))
	for newI, oldI := range idx {
		r := reqs[oldI]
		if r.DependsOn >= 0 {
			r.DependsOn = pos[r.DependsOn]
		}
		if r.SendsAnswer && r.AnswerOf >= 0 && r.AnswerOf < len(reqs) {
			r.AnswerOf = pos[r.AnswerOf]
		}
		out[newI] = r
	}
	copy(reqs, out)
}
