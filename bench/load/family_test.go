package load

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// familyShapes builds every generator of the family with small options.
func familyShapes(seed uint64) map[string]*Workload {
	return map[string]*Workload{
		"tenants": Tenants(TenantsOptions{Tenants: 3, Sessions: 2, SystemTokens: 600, Turns: 3, UserTokens: 20,
			AnswerTokens: 10, Think: time.Second, Duration: 5 * time.Second, Seed: seed}),
		"agentic": Agentic(AgenticOptions{Sessions: 3, Turns: 30, SystemTokens: 8000, TaskTokens: 4000, ToolTokens: 2100,
			AnswerTokens: 150, Think: 5 * time.Second, Duration: 10 * time.Second, Seed: seed}),
		"fewshot": FewShot(FewShotOptions{N: 60, Rate: 10, Templates: 4, TemplateTokens: 300, QueryTokens: 20, Seed: seed}),
		"rag": RAG(RAGOptions{N: 60, Rate: 10, SystemTokens: 100, Documents: 5, DocumentTokens: 300,
			QuestionTokens: 20, Seed: seed}),
		"sequential": Sequential(SequentialOptions{Conversations: 12, Turns: 3, SystemTokens: 400, UserTokens: 30,
			AnswerTokens: 20, Think: 100 * time.Millisecond, Seed: seed}),
		"bursts": Bursts(BurstsOptions{Bursts: 3, PerBurst: 8, Gap: 2 * time.Second, Prefixes: 2, PrefixTokens: 300,
			SuffixTokens: 20, Seed: seed}),
	}
}

// Every generator is deterministic in its seed, keeps arrival order,
// depends only on earlier requests, and carries answers back only where
// its messages extend the answered turn's.
func TestFamilyWellFormed(t *testing.T) {
	a, b, other := familyShapes(4), familyShapes(4), familyShapes(5)
	for name, w := range a {
		if !reflect.DeepEqual(w, b[name]) {
			t.Errorf("%s: not deterministic", name)
		}
		if reflect.DeepEqual(w.Requests, other[name].Requests) {
			t.Errorf("%s: another seed gives the same requests", name)
		}
		for i := range w.Requests {
			r := &w.Requests[i]
			if i > 0 && r.At < w.Requests[i-1].At {
				t.Errorf("%s: request %d arrives before %d", name, i, i-1)
			}
			if r.DependsOn >= i || r.PromptTokens != tokensOf(len(renderChat(r.Messages))) || r.MaxTokens <= 0 {
				t.Errorf("%s: request %d: depends on %d, %d prompt tokens, max_tokens %d", name, i, r.DependsOn, r.PromptTokens, r.MaxTokens)
			}
			if r.SendsAnswer {
				if err := checkSendsAnswer(w.Requests, i); err != nil || !slices.Equal(r.Messages[:len(w.Requests[r.AnswerOf].Messages)], w.Requests[r.AnswerOf].Messages) {
					t.Errorf("%s: request %d: %v (or its messages do not extend request %d's)", name, i, err, r.AnswerOf)
				}
			}
		}
		if hit := IdealHitRate(w, 16); hit < 0.3 {
			t.Errorf("%s: ideal hit rate %.3f, want the shared prefixes to show", name, hit)
		}
	}
}

// Agentic sessions grow from about 12k to about 80k tokens over 30 turns
// with think time between turns; every later turn sends back an answer.
func TestAgenticGrowth(t *testing.T) {
	w := familyShapes(1)["agentic"]
	if len(w.Requests) != 90 || !w.HasSessions {
		t.Fatalf("%d requests, sessions %v; want 3 × 30 with sessions", len(w.Requests), w.HasSessions)
	}
	bySession := map[string][]*Request{}
	for i := range w.Requests {
		r := &w.Requests[i]
		bySession[r.Session] = append(bySession[r.Session], r)
	}
	for s, turns := range bySession {
		first, last := turns[0].PromptTokens, turns[len(turns)-1].PromptTokens
		if len(turns) != 30 || first < 11_000 || first > 13_000 || last < 75_000 || last > 85_000 {
			t.Errorf("%s: %d turns from %d to %d tokens", s, len(turns), first, last)
		}
		for k, r := range turns[1:] {
			if !r.SendsAnswer || r.Think != 5*time.Second || &w.Requests[r.DependsOn] != turns[k] {
				t.Errorf("%s: turn %d: sends answer %v, think %v, depends on %d", s, k+1, r.SendsAnswer, r.Think, r.DependsOn)
			}
		}
	}
}

// One user at a time: every request depends on the one before it, the
// conversations take turns, and all share one system prompt.
func TestSequentialOneAtATime(t *testing.T) {
	w := familyShapes(1)["sequential"]
	if len(w.Requests) != 36 {
		t.Fatalf("%d requests, want 12 × 3", len(w.Requests))
	}
	sessions := map[string]bool{}
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.DependsOn != i-1 || r.Messages[0] != w.Requests[0].Messages[0] || r.Messages[0].Role != roleSystem {
			t.Errorf("request %d depends on %d, system prompt shared: %v", i, r.DependsOn, r.Messages[0] == w.Requests[0].Messages[0])
		}
		if want := "conv-" + string(rune('0'+i%12)); i%12 < 10 && r.Session != want {
			t.Errorf("request %d is %s, want %s", i, r.Session, want)
		}
		if i >= 12 && (!r.SendsAnswer || w.Requests[r.AnswerOf].Session != r.Session || r.AnswerOf != i-12) {
			t.Errorf("request %d sends back the answer of %d", i, r.AnswerOf)
		}
		sessions[r.Session] = true
	}
	if len(sessions) != 12 {
		t.Errorf("%d conversations, want 12", len(sessions))
	}
}

// Bursts arrive all at once, Gap apart; RAG and few-shot requests share a
// prefix from a small set and end uniquely.
func TestBurstsAndOneShots(t *testing.T) {
	shapes := familyShapes(2)
	w := shapes["bursts"]
	for i, r := range w.Requests {
		if want := time.Duration(i/8) * 2 * time.Second; r.At != want || r.DependsOn != -1 {
			t.Errorf("bursts: request %d at %v, want %v", i, r.At, want)
		}
	}
	for name, want := range map[string]int{"rag": 5, "fewshot": 4, "bursts": 2} {
		shared, unique := map[string]bool{}, map[string]bool{}
		for _, r := range shapes[name].Requests {
			msgs := r.Messages
			shared[renderChat(msgs[:len(msgs)-1])] = true
			unique[msgs[len(msgs)-1].Content] = true
		}
		if len(shared) > want || len(shared) < 2 || len(unique) != len(shapes[name].Requests) {
			t.Errorf("%s: %d shared prefixes (want 2 to %d), %d unique endings of %d", name, len(shared), want, len(unique), len(shapes[name].Requests))
		}
	}
	if !strings.HasPrefix(shapes["rag"].Requests[0].Messages[0].Content, shapes["rag"].Requests[1].Messages[0].Content) {
		t.Error("rag: the system prompt is not shared")
	}
}
