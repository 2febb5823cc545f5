package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// chatTurn sends a chat request of msgs (max_tokens maxTokens, ignore_eos)
// and returns the answer's content, read from the JSON body or, with
// stream, from the SSE deltas, and the usage.
func chatTurn(ctx context.Context, url string, msgs []Message, maxTokens int, stream bool) (string, usage, error) {
	wire := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		wire[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	body := map[string]any{"messages": wire, "max_tokens": maxTokens, "ignore_eos": true}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	js, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(js))
	if err != nil {
		return "", usage{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", usage{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return "", usage{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	if !stream {
		var c completion
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
			return "", usage{}, err
		}
		if c.Usage == nil || len(c.Choices) != 1 {
			return "", usage{}, errors.New("no usage or choice")
		}
		return c.Choices[0].Message.Content, *c.Usage, nil
	}
	var text strings.Builder
	var u *usage
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		d, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			done = true
			break
		}
		var c completion
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			return "", usage{}, err
		}
		if len(c.Choices) == 1 && c.Choices[0].Delta.Content != nil {
			text.WriteString(*c.Choices[0].Delta.Content)
		}
		if c.Usage != nil {
			u = c.Usage
		}
	}
	if !done || u == nil {
		return "", usage{}, fmt.Errorf("stream ended early (done %v, usage %v): %w", done, u != nil, sc.Err())
	}
	return text.String(), *u, nil
}

// wholeBlockTokens is the number of tokens in the whole 16-token blocks of
// b.
func wholeBlockTokens(b []byte) int { return len(b) / (16 * BytesPerToken) * 16 }

// checkCache checks the kv cache's bookkeeping: the LRU list holds exactly
// lruLen unreferenced keyed blocks, pinned and cached blocks fit the
// capacity, and with nothing running every keyed block is on the LRU list
// (none leaked as pinned or unreachable).
func checkCache(t *testing.T, r *Replica) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.cache
	n := 0
	for b := c.head; b != nil; b = b.next {
		n++
		if n > c.total {
			t.Fatal("LRU list longer than the cache")
		}
		if !b.onLRU || b.ref != 0 || !b.hashed || c.byKey[b.key] != b {
			t.Fatalf("LRU block %d: onLRU %v ref %d hashed %v", n, b.onLRU, b.ref, b.hashed)
		}
	}
	if n != c.lruLen || c.pinned < 0 || c.pinned+c.lruLen > c.total {
		t.Fatalf("LRU walk %d, lruLen %d, pinned %d, total %d", n, c.lruLen, c.pinned, c.total)
	}
	if len(r.running) == 0 && len(r.waiting) == 0 && (c.pinned != 0 || len(c.byKey) != c.lruLen) {
		t.Fatalf("idle: pinned %d, keyed %d, cached %d", c.pinned, len(c.byKey), c.lruLen)
	}
	if r.host != nil && (r.host.len() > r.host.cap || len(r.host.ents) > r.host.cap) {
		t.Fatalf("host tier holds %d (arena %d) over capacity %d", r.host.len(), len(r.host.ents), r.host.cap)
	}
}

// TestAnswerBlocksCached: the next turn of a conversation that carries the
// previous answer back hits the whole blocks of prompt and answer; one
// carrying a different answer of the same length hits only the prompt's.
func TestAnswerBlocksCached(t *testing.T) {
	rep, url := startReplica(t, nil)
	ctx := t.Context()
	turn1 := []Message{{Role: "system", Content: prompt("sys", 300)}, {Role: "user", Content: "q1"}}
	a1, u1, err := chatTurn(ctx, url, turn1, 37, false)
	if err != nil {
		t.Fatal(err)
	}
	if a1 != ChatAnswerText(turn1, 37) || len(a1) != 37*BytesPerToken || u1.CompletionTokens != 37 {
		t.Fatalf("answer %q (%d tokens), want ChatAnswerText's %q", a1, u1.CompletionTokens, ChatAnswerText(turn1, 37))
	}
	// The previous rendering (322 bytes, 5 whole blocks) + "<|assistant|>"
	// + 148 bytes + "\n" = 484 bytes: 7 whole blocks.
	withAnswer := append(turn1[:2:2], Message{Role: "assistant", Content: a1})
	turn2 := append(withAnswer[:3:3], Message{Role: "user", Content: "q2"})
	if got := wholeBlockTokens(RenderChat(withAnswer)); got != 112 {
		t.Fatalf("test arithmetic: %d", got)
	}
	// Streamed this time: the deltas are the same answer text.
	a2, u2, err := chatTurn(ctx, url, turn2, 21, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := u2.PromptTokensDetails.CachedTokens; got != 112 {
		t.Fatalf("turn 2 cached %d, want 112 (prompt and answer blocks)", got)
	}
	if a2 != ChatAnswerText(turn2, 21) {
		t.Fatalf("streamed answer %q, want %q", a2, ChatAnswerText(turn2, 21))
	}
	// A third turn hits through the second answer too.
	turn3 := append(append(turn2[:4:4], Message{Role: "assistant", Content: a2}), Message{Role: "user", Content: "q3"})
	_, u3, err := chatTurn(ctx, url, turn3, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := wholeBlockTokens(RenderChat(turn3[:5])); u3.PromptTokensDetails.CachedTokens != want || want <= 112 {
		t.Fatalf("turn 3 cached %d, want %d", u3.PromptTokensDetails.CachedTokens, want)
	}

	// Control: a conversation whose second turn carries another text of
	// the answer's length hits only the first prompt's 5 blocks.
	other := []Message{{Role: "system", Content: prompt("other", 300)}, {Role: "user", Content: "q1"}}
	if _, _, err := chatTurn(ctx, url, other, 37, false); err != nil {
		t.Fatal(err)
	}
	fake := append(other[:2:2], Message{Role: "assistant", Content: strings.Repeat(" abc", 37)}, Message{Role: "user", Content: "q2"})
	if _, u, err := chatTurn(ctx, url, fake, 1, false); err != nil || u.PromptTokensDetails.CachedTokens != 80 {
		t.Fatalf("fabricated answer: cached %d (%v), want 80", u.PromptTokensDetails.CachedTokens, err)
	}

	// Completions: the next prompt is the prompt followed by the text.
	p := prompt("c", 6*64+2)
	c := complete(t, url, map[string]any{"prompt": p, "max_tokens": 20, "ignore_eos": true})
	if c.Choices[0].Text != AnswerText([]byte(p), 20) {
		t.Fatalf("completion text %q, want %q", c.Choices[0].Text, AnswerText([]byte(p), 20))
	}
	// 386 + 80 bytes: 7 whole blocks.
	c = complete(t, url, map[string]any{"prompt": p + c.Choices[0].Text + " more", "max_tokens": 1})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 112 {
		t.Fatalf("completion continuation cached %d, want 112", got)
	}
	// Without ignore_eos the length is CompletionTokens'.
	q := prompt("eos", 200)
	c = complete(t, url, map[string]any{"prompt": q, "max_tokens": 40})
	n := CompletionTokens([]byte(q), 40, 0, false)
	if c.Usage.CompletionTokens != n || n < 20 || c.Choices[0].Text != AnswerText([]byte(q), n) {
		t.Fatalf("early stop: %d tokens %q, want %d", c.Usage.CompletionTokens, c.Choices[0].Text, n)
	}
	if st := rep.Stats(); st.PinnedBlocks != 0 || st.Finished != st.Requests {
		t.Fatalf("stats %+v", st)
	}
	checkCache(t, rep)
}

// TestAnswerCachingAccounting runs concurrent conversations that send their
// answers back into a replica too small to hold them (evictions and
// preemptions), some clients going away mid-answer, and checks the cache's
// bookkeeping stays exact, with and without a host tier.
func TestAnswerCachingAccounting(t *testing.T) {
	for _, host := range []int{0, 150} {
		t.Run(fmt.Sprint("host", host), func(t *testing.T) {
			rep, url := startReplica(t, func(c *Config) {
				c.NumGPUBlocks = 64
				c.HostBlocks = host
			})
			ctx := t.Context()
			const sessions, turns = 12, 4
			var wg sync.WaitGroup
			errs := make(chan error, sessions*turns)
			for s := 0; s < sessions; s++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					msgs := []Message{{Role: "system", Content: prompt(fmt.Sprint("sys", s%3), 400)}}
					for k := 0; k < turns; k++ {
						msgs = append(msgs, Message{Role: "user", Content: prompt(fmt.Sprint("u", s, "t", k), 100)})
						if s%4 == 3 && k == 2 {
							// Gone mid-answer: the request is aborted.
							if err := abandonTurn(ctx, url, msgs); err != nil {
								errs <- err
							}
							return
						}
						a, u, err := chatTurn(ctx, url, msgs, 30, k%2 == 1)
						if err != nil {
							errs <- err
							return
						}
						if u.PromptTokensDetails.CachedTokens%16 != 0 || u.PromptTokensDetails.CachedTokens >= u.PromptTokens {
							errs <- fmt.Errorf("session %d turn %d: cached %d of %d", s, k, u.PromptTokensDetails.CachedTokens, u.PromptTokens)
						}
						if a != ChatAnswerText(msgs, 30) {
							errs <- fmt.Errorf("session %d turn %d: answer differs from ChatAnswerText", s, k)
						}
						msgs = append(msgs, Message{Role: "assistant", Content: a})
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			waitFor(t, func() bool { st := rep.Stats(); return st.Running == 0 && st.Waiting == 0 })
			st := rep.Stats()
			if st.PinnedBlocks != 0 || st.Finished+st.Aborted != st.Requests || st.Aborted != 3 || st.CachedBlocks > st.NumBlocks {
				t.Fatalf("stats %+v", st)
			}
			if st.Preemptions == 0 || st.HitTokens == 0 {
				t.Fatalf("no pressure: %+v", st)
			}
			checkCache(t, rep)
		})
	}
}

// abandonTurn sends a streaming chat request of msgs and goes away after
// its first event.
func abandonTurn(ctx context.Context, url string, msgs []Message) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wire := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		wire[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	js, _ := json.Marshal(map[string]any{"messages": wire, "max_tokens": 300, "ignore_eos": true, "stream": true})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(js))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: {") {
		return fmt.Errorf("abandoned turn: first line %q: %w", line, err)
	}
	return nil
}
