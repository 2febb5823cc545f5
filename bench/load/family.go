package load

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// The workload family: generators for the shapes of traffic a router meets
// (tenants, agentic coding, few-shot one-shots, RAG, one user at a time,
// bursts), beside MultiTurn, HotPrefix, NoReuse and the traces. Like the
// others they are deterministic in their options and seed.

// Namespaces of the family's text streams.
var (
	tagAgentSystem = strSeed("agentic-system")
	tagAgentTask   = strSeed("agentic-task")
	tagAgentTool   = strSeed("agentic-tool")
	tagAgentAnswer = strSeed("agentic-answer")
	tagShot        = strSeed("fewshot-template")
	tagShotQuery   = strSeed("fewshot-query")
	tagRAGSystem   = strSeed("rag-system")
	tagRAGDoc      = strSeed("rag-document")
	tagRAGQuestion = strSeed("rag-question")
	tagSeqSystem   = strSeed("sequential-system")
	tagSeqUser     = strSeed("sequential-user")
	tagSeqAnswer   = strSeed("sequential-answer")
	tagBurstPrefix = strSeed("bursts-prefix")
	tagBurstSuffix = strSeed("bursts-suffix")
)

// TenantsOptions configures Tenants.
type TenantsOptions struct {
	// Tenants is the number of tenants, each with its own system prompt of
	// SystemTokens; Sessions is the number of sessions per tenant.
	Tenants, Sessions, SystemTokens int
	// Turns, UserTokens, AnswerTokens, Think and Duration are as in
	// MultiTurnOptions.
	Turns, UserTokens, AnswerTokens int
	Think, Duration                 time.Duration
	Seed                            uint64
}

// Tenants returns Tenants × Sessions multi-turn sessions, each tenant's
// sessions sharing its long system prompt: MultiTurn with one system prompt
// per tenant (session u belongs to tenant u mod Tenants).
func Tenants(opt TenantsOptions) *Workload {
	tenants := max(opt.Tenants, 1)
	w := MultiTurn(MultiTurnOptions{
		Users: tenants * max(opt.Sessions, 1), SystemPrompts: tenants, SystemTokens: opt.SystemTokens,
		Turns: opt.Turns, Think: opt.Think, UserTokens: opt.UserTokens, AnswerTokens: opt.AnswerTokens,
		Duration: opt.Duration, Seed: opt.Seed,
	})
	w.Name = fmt.Sprintf("tenants(tenants=%d,sessions=%d,system=%d,turns=%d)", tenants, max(opt.Sessions, 1), opt.SystemTokens, max(opt.Turns, 1))
	return w
}

// AgenticOptions configures Agentic.
type AgenticOptions struct {
	// Sessions is the number of coding sessions; Turns the turns of each.
	Sessions, Turns int
	// SystemTokens is the agent's system prompt (instructions and tool
	// definitions), shared by every session; TaskTokens the session's
	// first user message (the task and the files it starts from).
	SystemTokens, TaskTokens int
	// ToolTokens is each later turn's new user message (a tool result);
	// AnswerTokens each answer (max_tokens, and the assistant message the
	// next turn carries).
	ToolTokens, AnswerTokens int
	// Think is the pause between an answer and the next turn (the tool
	// running); Duration spreads the sessions' starts over [0, Duration).
	Think, Duration time.Duration
	Seed            uint64
}

// Agentic returns agentic coding sessions: each starts with the shared
// system prompt and its task, and every turn appends the previous answer
// and a tool result, so the context grows by AnswerTokens + ToolTokens a
// turn (with the defaults of the bench, from about 12k to about 80k tokens
// over 30 turns). Every later turn carries back the answer the previous one
// received (SendsAnswer). Session is "agent-N".
func Agentic(opt AgenticOptions) *Workload {
	sessions, turns := max(opt.Sessions, 1), max(opt.Turns, 1)
	ans := cmpOr(opt.AnswerTokens, 128)
	system := Message{Role: roleSystem, Content: synthText(mix(tagAgentSystem, opt.Seed), opt.SystemTokens)}
	starts := uniformStarts(sessions, opt.Duration, opt.Seed)
	w := &Workload{
		Name:        fmt.Sprintf("agentic(sessions=%d,turns=%d,system=%d,task=%d,tool=%d)", sessions, turns, opt.SystemTokens, opt.TaskTokens, opt.ToolTokens),
		HasSessions: true,
	}
	for s := range sessions {
		msgs := []Message{system}
		prev := -1
		for k := range turns {
			user := synthText(mix(tagAgentTask, opt.Seed, uint64(s)), opt.TaskTokens)
			think := time.Duration(0)
			if k > 0 {
				msgs = append(msgs, Message{Role: roleAssistant, Content: synthText(mix(tagAgentAnswer, opt.Seed, uint64(s), uint64(k-1)), ans)})
				user, think = synthText(mix(tagAgentTool, opt.Seed, uint64(s), uint64(k)), opt.ToolTokens), opt.Think
			}
			msgs = append(msgs, Message{Role: roleUser, Content: user})
			prev = appendTurn(w, msgs, "agent-"+strconv.Itoa(s), starts[s]+time.Duration(k)*opt.Think, ans, prev, prev, think)
		}
	}
	sortByArrival(w.Requests)
	return w
}

// FewShotOptions configures FewShot.
type FewShotOptions struct {
	// N requests arrive at Rate req/s (Poisson; 0 sends all at once).
	N    int
	Rate float64
	// Templates is the number of few-shot prompts (instructions and worked
	// examples) of TemplateTokens each; template t is picked with weight
	// 1/(t+1). QueryTokens is each request's own query.
	Templates, TemplateTokens, QueryTokens int
	// MaxTokens is max_tokens (default 128).
	MaxTokens int
	Seed      uint64
}

// FewShot returns one-shot requests, each a long few-shot template drawn
// from a few (the first the most popular) followed by a unique query.
func FewShot(opt FewShotOptions) *Workload {
	templates := make([]string, max(opt.Templates, 1))
	for t := range templates {
		templates[t] = synthText(mix(tagShot, opt.Seed, uint64(t)), opt.TemplateTokens)
	}
	pick := harmonicPicker(len(templates), opt.Seed)
	name := fmt.Sprintf("fewshot(n=%d,templates=%d,template=%d,query=%d)", max(opt.N, 0), len(templates), opt.TemplateTokens, opt.QueryTokens)
	return oneShots(name, opt.N, opt.Rate, opt.MaxTokens, opt.Seed, func(i int) []Message {
		return []Message{
			{Role: roleSystem, Content: templates[pick()]},
			{Role: roleUser, Content: synthText(mix(tagShotQuery, opt.Seed, uint64(i)), opt.QueryTokens)},
		}
	})
}

// RAGOptions configures RAG.
type RAGOptions struct {
	// N requests arrive at Rate req/s (Poisson; 0 sends all at once).
	N    int
	Rate float64
	// SystemTokens is the shared system prompt; Documents the number of
	// shared documents of DocumentTokens each, picked uniformly;
	// QuestionTokens each request's own question.
	SystemTokens, Documents, DocumentTokens, QuestionTokens int
	// MaxTokens is max_tokens (default 128).
	MaxTokens int
	Seed      uint64
}

// RAG returns retrieval-augmented one-shots: the system prompt, then one of
// the shared documents, then a unique question.
func RAG(opt RAGOptions) *Workload {
	system := synthText(mix(tagRAGSystem, opt.Seed), opt.SystemTokens)
	docs := make([]string, max(opt.Documents, 1))
	for d := range docs {
		docs[d] = synthText(mix(tagRAGDoc, opt.Seed, uint64(d)), opt.DocumentTokens)
	}
	r := splitmix64{mix(tagPick, opt.Seed)}
	name := fmt.Sprintf("rag(n=%d,system=%d,documents=%dx%d,question=%d)", max(opt.N, 0), opt.SystemTokens, len(docs), opt.DocumentTokens, opt.QuestionTokens)
	return oneShots(name, opt.N, opt.Rate, opt.MaxTokens, opt.Seed, func(i int) []Message {
		return []Message{
			{Role: roleSystem, Content: system},
			{Role: roleUser, Content: docs[r.intn(len(docs))]},
			{Role: roleUser, Content: synthText(mix(tagRAGQuestion, opt.Seed, uint64(i)), opt.QuestionTokens)},
		}
	})
}

// SequentialOptions configures Sequential.
type SequentialOptions struct {
	// Conversations share one system prompt of SystemTokens; each has
	// Turns turns of UserTokens, answered in AnswerTokens.
	Conversations, Turns, SystemTokens, UserTokens, AnswerTokens int
	// Think is the pause between one request's answer and the next request.
	Think time.Duration
	Seed  uint64
}

// Sequential returns one user at a time: Conversations conversations
// sharing one system prompt, taken in turn (turn 0 of every conversation,
// then turn 1 of every one, ...), every request depending on the one before
// it, so exactly one request is ever in flight. Session is "conv-N"; each
// turn carries its conversation's history, with the answers it received
// (SendsAnswer, AnswerOf the conversation's previous turn).
func Sequential(opt SequentialOptions) *Workload {
	convs, turns := max(opt.Conversations, 1), max(opt.Turns, 1)
	user, ans := cmpOr(opt.UserTokens, 64), cmpOr(opt.AnswerTokens, 128)
	system := Message{Role: roleSystem, Content: synthText(mix(tagSeqSystem, opt.Seed), opt.SystemTokens)}
	hist := make([][]Message, convs)
	last := make([]int, convs) // each conversation's previous turn
	w := &Workload{
		Name:        fmt.Sprintf("sequential(conversations=%d,turns=%d,system=%d)", convs, turns, opt.SystemTokens),
		HasSessions: true,
	}
	prev := -1
	for k := range turns {
		for c := range convs {
			if k == 0 {
				hist[c] = []Message{system}
			} else {
				hist[c] = append(hist[c], Message{Role: roleAssistant, Content: synthText(mix(tagSeqAnswer, opt.Seed, uint64(c), uint64(k-1)), ans)})
			}
			hist[c] = append(hist[c], Message{Role: roleUser, Content: synthText(mix(tagSeqUser, opt.Seed, uint64(c), uint64(k)), user)})
			think := opt.Think
			if prev < 0 {
				think = 0
			}
			answerOf := -1
			if k > 0 {
				answerOf = last[c]
			}
			prev = appendTurn(w, hist[c], "conv-"+strconv.Itoa(c), 0, ans, prev, answerOf, think)
			last[c] = prev
		}
	}
	return w
}

// BurstsOptions configures Bursts.
type BurstsOptions struct {
	// Bursts bursts of PerBurst requests arrive Gap apart, all of a burst
	// at once.
	Bursts, PerBurst int
	Gap              time.Duration
	// Prefixes is the number of shared system prompts of PrefixTokens, the
	// requests of a burst taking them in turn; SuffixTokens each request's
	// own message.
	Prefixes, PrefixTokens, SuffixTokens int
	// MaxTokens is max_tokens (default 128).
	MaxTokens int
	Seed      uint64
}

// Bursts returns bursty traffic: every Gap, PerBurst requests at the same
// instant, spread over a few shared prefixes, each with a unique suffix.
func Bursts(opt BurstsOptions) *Workload {
	bursts, per := max(opt.Bursts, 1), max(opt.PerBurst, 1)
	prefixes := make([]string, max(opt.Prefixes, 1))
	for p := range prefixes {
		prefixes[p] = synthText(mix(tagBurstPrefix, opt.Seed, uint64(p)), opt.PrefixTokens)
	}
	maxTok := cmpOr(opt.MaxTokens, 128)
	w := &Workload{Name: fmt.Sprintf("bursts(bursts=%d,per=%d,prefixes=%dx%d)", bursts, per, len(prefixes), opt.PrefixTokens)}
	for b := range bursts {
		for j := range per {
			i := b*per + j
			msgs := []Message{
				{Role: roleSystem, Content: prefixes[j%len(prefixes)]},
				{Role: roleUser, Content: synthText(mix(tagBurstSuffix, opt.Seed, uint64(i)), opt.SuffixTokens)},
			}
			appendTurn(w, msgs, "", time.Duration(b)*opt.Gap, maxTok, -1, -1, 0)
		}
	}
	return w
}

// oneShots returns n independent requests arriving at rate (Poisson), the
// messages of request i from msgs(i), called in index order.
func oneShots(name string, n int, rate float64, maxTokens int, seed uint64, msgs func(i int) []Message) *Workload {
	n = max(n, 0)
	at := poissonArrivals(n, rate, seed)
	w := &Workload{Name: name, Requests: make([]Request, 0, n)}
	for i := range n {
		appendTurn(w, msgs(i), "", at[i], cmpOr(maxTokens, 128), -1, -1, 0)
	}
	return w
}

// appendTurn appends a request of a copy of msgs to w and returns its index.
// answerOf ≥ 0 makes it carry back that request's answer (SendsAnswer): msgs
// then extend answerOf's messages by a placeholder assistant message.
func appendTurn(w *Workload, msgs []Message, session string, at time.Duration, maxTokens, dependsOn, answerOf int, think time.Duration) int {
	turn := slices.Clip(slices.Clone(msgs))
	w.Requests = append(w.Requests, Request{
		At:           at,
		Session:      session,
		Messages:     turn,
		MaxTokens:    maxTokens,
		PromptTokens: tokensOf(len(renderChat(turn))),
		DependsOn:    dependsOn,
		Think:        think,
		SendsAnswer:  answerOf >= 0,
		AnswerOf:     answerOf,
	})
	return len(w.Requests) - 1
}

// uniformStarts returns n sorted start offsets uniform in [0, d) (all 0
// when d is 0).
func uniformStarts(n int, d time.Duration, seed uint64) []time.Duration {
	out := make([]time.Duration, n)
	if d > 0 {
		r := splitmix64{mix(tagArrivals, seed)}
		for i := range out {
			out[i] = time.Duration(r.float64() * float64(d))
		}
		slices.Sort(out)
	}
	return out
}

// harmonicPicker returns a seeded sampler of [0, n) with weights 1/(k+1).
func harmonicPicker(n int, seed uint64) func() int {
	cum := make([]float64, n)
	total := 0.0
	for k := range cum {
		total += 1 / float64(k+1)
		cum[k] = total
	}
	r := splitmix64{mix(tagPick, seed)}
	return func() int {
		x := r.float64() * total
		k, _ := slices.BinarySearch(cum, x)
		return min(k, n-1)
	}
}

// cmpOr is v when positive, else def.
func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}
