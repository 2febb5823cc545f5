package load

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/bench/sim"
)

// recordingSim is a bench/sim replica behind a handler on 127.0.0.1 that
// records the messages of every request by session, answers 503 to a
// request whose last message is "fail", and asks the replica for a
// non-streamed JSON answer when the session is "json".
type recordingSim struct {
	*httptest.Server
	rep *sim.Replica

	mu   sync.Mutex
	seen map[string][][]Message
}

func newRecordingSim(t *testing.T) *recordingSim {
	t.Helper()
	rep, err := sim.NewReplica(sim.Config{
		Preset: "llama-8b-h100", Model: "test-model", NumGPUBlocks: 4000,
		StepBaseMs: 1, DecodeSeqMs: -1, DecodeCtxMs: -1, PrefillTokenMs: 0.0001,
		PrefillCtxMs: -1, PrefillAttnMs: -1, CachedTokenFrac: -1, WatermarkFrac: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	rs := &recordingSim{rep: rep, seen: map[string][][]Message{}}
	h := rep.Handler()
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b map[string]any
		var m struct{ Messages []Message }
		if json.Unmarshal(body, &b) != nil || json.Unmarshal(body, &m) != nil || len(m.Messages) == 0 {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		sess := r.Header.Get("X-Session-ID")
		rs.mu.Lock()
		rs.seen[sess] = append(rs.seen[sess], m.Messages)
		rs.mu.Unlock()
		if m.Messages[len(m.Messages)-1].Content == "fail" {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		if sess == "json" {
			b["stream"] = false
			body, _ = json.Marshal(b)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { rs.Close(); rep.Close() })
	return rs
}

func simMessages(msgs []Message) []sim.Message {
	out := make([]sim.Message, len(msgs))
	for i, m := range msgs {
		out[i] = sim.Message{Role: m.Role, Content: m.Content}
	}
	return out
}

// TestRunSendsAnswers: a multi-turn workload replayed into a real replica
// sends back, turn after turn, the answers the replica gave; each turn hits
// the whole blocks of the previous prompt and its answer (as AnswerBytes
// says), and the hit rate is IdealHitRate's, which counts those blocks.
func TestRunSendsAnswers(t *testing.T) {
	rs := newRecordingSim(t)
	const users, turns, answer = 3, 4, 30
	opt := MultiTurnOptions{Users: users, SystemPrompts: users, SystemTokens: 150, Turns: turns,
		UserTokens: 20, AnswerTokens: answer, Seed: 5}
	w := MultiTurn(opt)
	res, err := Run(t.Context(), rs.URL, w, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	var cached, prompt int
	for i, s := range res.Samples {
		r := &w.Requests[i]
		if !s.OK() || !s.CachedReported || r.SendsAnswer != (r.DependsOn >= 0) {
			t.Fatalf("sample %d: %+v (sends answer %v)", i, s, r.SendsAnswer)
		}
		cached += s.CachedTokens
		prompt += s.PromptTokens
	}
	for sess, got := range rs.seen {
		if len(got) != turns {
			t.Fatalf("%s: %d turns", sess, len(got))
		}
		for k := 1; k < turns; k++ {
			prev, cur := got[k-1], got[k]
			want := sim.ChatAnswerText(simMessages(prev), answer)
			if len(cur) != len(prev)+2 || !slices.Equal(cur[:len(prev)], prev) || cur[len(prev)].Role != "assistant" || cur[len(prev)].Content != want {
				t.Fatalf("%s turn %d does not carry turn %d's messages and answer", sess, k, k-1)
			}
		}
	}
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.DependsOn < 0 {
			continue
		}
		// Sent as the replica rendered it: the earlier turn's messages and
		// its answer, then the new user message.
		k := 0
		for j := i; w.Requests[j].DependsOn >= 0; j = w.Requests[j].DependsOn {
			k++
		}
		sent := rs.seen[r.Session][k]
		want := len(sim.RenderChat(simMessages(sent[:len(sent)-1]))) / 64 * 16
		if got := res.Samples[i].CachedTokens; got != want || w.AnswerBytes(i)/64*16 != want {
			t.Fatalf("request %d (%s turn %d): cached %d, want %d (prompt and answer blocks; AnswerBytes %d)", i, r.Session, k, got, want, w.AnswerBytes(i))
		}
	}
	if ideal, hr := IdealHitRate(w, 16), float64(cached)/float64(prompt); hr != ideal {
		t.Fatalf("hit rate %.4f, ideal %.4f", hr, ideal)
	}
	// With Placeholders the same workload sends its placeholders and
	// IdealHitRate counts prompts only.
	opt.Placeholders = true
	plain := MultiTurn(opt)
	for i := range plain.Requests {
		if r := &plain.Requests[i]; r.SendsAnswer || plain.AnswerBytes(i) != 0 || !slices.Equal(r.Messages, w.Requests[i].Messages) {
			t.Fatalf("request %d with Placeholders: %+v", i, r)
		}
	}
	if IdealHitRate(plain, 16) >= IdealHitRate(w, 16) {
		t.Fatalf("ideal %.4f without answers, %.4f with", IdealHitRate(plain, 16), IdealHitRate(w, 16))
	}
	for i := range w.Requests {
		if r := &w.Requests[i]; (w.AnswerBytes(i) > 0) != r.SendsAnswer {
			t.Fatalf("request %d: AnswerBytes %d, sends answer %v", i, w.AnswerBytes(i), r.SendsAnswer)
		}
	}
	if st := rs.rep.Stats(); st.PinnedBlocks != 0 || st.Finished != int64(users*turns) {
		t.Fatalf("replica %+v", st)
	}
}

// TestRunSendsAnswerFallbacks: a non-streamed answer is carried back too; a
// failed turn's placeholder is sent instead; a request that cannot carry
// its dependency's answer is refused.
func TestRunSendsAnswerFallbacks(t *testing.T) {
	rs := newRecordingSim(t)
	sys := Message{Role: roleSystem, Content: strings.Repeat(" sys", 100)}
	turn := func(sess string, msgs ...Message) Request {
		return Request{Session: sess, Messages: msgs, MaxTokens: 5, PromptTokens: 1, DependsOn: -1}
	}
	ph := Message{Role: roleAssistant, Content: "placeholder"}
	user := func(c string) Message { return Message{Role: roleUser, Content: c} }
	// Requests 4 to 7 are strictly sequential conversations a and b: each
	// turn waits for the request before it (the other conversation's) and
	// carries the answer of its own conversation's previous turn.
	reqs := []Request{
		turn("json", sys, user("q1")),
		turn("json", sys, user("q1"), ph, user("q2")),
		turn("f", sys, user("fail")),
		turn("f", sys, user("fail"), ph, user("q2")),
		turn("a", sys, user("a0")),
		turn("b", sys, user("b0")),
		turn("a", sys, user("a0"), ph, user("a1")),
		turn("b", sys, user("b0"), ph, user("b1")),
	}
	for i, dep := range []int{-1, 0, -1, 2, -1, 4, 5, 6} {
		reqs[i].DependsOn = dep
	}
	for i, of := range map[int]int{1: 0, 3: 2, 6: 4, 7: 5} {
		reqs[i].SendsAnswer, reqs[i].AnswerOf = true, of
	}
	res, err := Run(context.Background(), rs.URL, &Workload{Requests: reqs, HasSessions: true}, RunOptions{Model: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Samples[0].OK() || !res.Samples[1].OK() || res.Samples[2].ErrKind != "http_503" || !res.Samples[3].OK() {
		t.Fatalf("samples %+v", res.Samples)
	}
	if got, want := rs.seen["json"][1][2].Content, sim.ChatAnswerText(simMessages(reqs[0].Messages), 5); got != want {
		t.Fatalf("JSON answer sent back %q, want %q", got, want)
	}
	if got := rs.seen["f"][1][2].Content; got != "placeholder" {
		t.Fatalf("after a failed turn sent %q, want the placeholder", got)
	}
	for _, sess := range []string{"a", "b"} {
		got := rs.seen[sess]
		if len(got) != 2 || got[1][2].Content != sim.ChatAnswerText(simMessages(got[0]), 5) {
			t.Fatalf("conversation %s: turn 1 does not carry turn 0's answer: %+v", sess, got)
		}
	}
	for i := 4; i < 8; i++ {
		if s := res.Samples[i]; !s.OK() || (i > 4 && s.Start < res.Samples[i-1].Start+res.Samples[i-1].Latency) {
			t.Fatalf("sequential request %d: %+v", i, s)
		}
	}

	bad := [][]Request{
		{turn("", sys), turn("", sys, ph)},                                    // AnswerOf -1
		{turn("", sys), turn("", sys, ph)},                                    // AnswerOf itself
		{turn("", sys), turn("", sys, Message{Role: roleUser, Content: "x"})}, // no assistant message
		{turn("", sys, ph), turn("", sys)},                                    // shorter
	}
	for i, b := range bad {
		b[1].SendsAnswer, b[1].AnswerOf = true, []int{-1, 1, 0, 0}[i]
		if _, err := Run(context.Background(), rs.URL, &Workload{Requests: b}, RunOptions{}); err == nil {
			t.Fatalf("bad workload %d accepted", i)
		}
	}
}
