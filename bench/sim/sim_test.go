package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// fastConfig is a cheap deterministic cost model: every step costs 2 ms,
// prefill is nearly free.
func fastConfig() Config {
	return Config{
		Preset:          "llama-8b-h100",
		Model:           "sim-test",
		NumGPUBlocks:    1000,
		StepBaseMs:      2,
		DecodeSeqMs:     -1,
		DecodeCtxMs:     -1,
		PrefillTokenMs:  0.0001,
		PrefillCtxMs:    -1,
		PrefillAttnMs:   -1,
		CachedTokenFrac: -1,
		WatermarkFrac:   -1,
	}
}

func startReplica(t *testing.T, mod func(*Config)) (*Replica, string) {
	t.Helper()
	cfg := fastConfig()
	if mod != nil {
		mod(&cfg)
	}
	f, err := StartFleet(context.Background(), 1, 0, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	if !strings.HasPrefix(f.URLs[0], "http://127.0.0.1:") {
		t.Fatalf("url %s", f.URLs[0])
	}
	return f.Replicas[0], f.URLs[0]
}

var client = &http.Client{Timeout: 20 * time.Second}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// get sends GET url with t's context.
func get(t *testing.T, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return client.Do(req)
}

func post(t *testing.T, url, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	default:
		js, _ := json.Marshal(b)
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func complete(t *testing.T, url string, body map[string]any) completion {
	t.Helper()
	path := "/v1/completions"
	if _, ok := body["messages"]; ok {
		path = "/v1/chat/completions"
	}
	code, out := post(t, url, path, body)
	if code != 200 {
		t.Fatalf("status %d: %s", code, out)
	}
	var c completion
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if c.Usage == nil {
		t.Fatalf("no usage: %s", out)
	}
	return c
}

// event is one SSE data line and when it arrived.
type event struct {
	data string
	at   time.Time
}

// streamReq posts a streaming request and returns its events. onEvent, if
// not nil, runs as each event is read.
func streamReq(ctx context.Context, t *testing.T, url, path string, body map[string]any, onEvent ...func(i int)) []event {
	t.Helper()
	body["stream"] = true
	js, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, "POST", url+path, bytes.NewReader(js))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Error(err)
		return nil
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("status %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		return nil
	}
	var evs []event
	sc := bufio.NewScanner(resp.Body)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		if !blank || !strings.HasPrefix(line, "data: ") {
			t.Errorf("bad SSE framing at %q", line)
			return evs
		}
		blank = false
		evs = append(evs, event{strings.TrimPrefix(line, "data: "), time.Now()})
		for _, f := range onEvent {
			f(len(evs) - 1)
		}
	}
	return evs
}

// prompt returns a deterministic ASCII prompt of n bytes.
func prompt(seed string, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%s-%d ", seed, i)
	}
	return b.String()[:n]
}

func TestStreamingChat(t *testing.T) {
	_, url := startReplica(t, nil)
	start := time.Now()
	evs := streamReq(context.Background(), t, url, "/v1/chat/completions", map[string]any{
		"model":          "sim-test",
		"messages":       []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}},
		"max_tokens":     40,
		"ignore_eos":     true,
		"stream_options": map[string]any{"include_usage": true},
	})
	total := time.Since(start)
	if len(evs) < 3 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("events: %v", evs)
	}
	// 40 steps of 2 ms: the whole stream takes ~80 ms; the first chunk
	// comes after one step, so it arrives well before the last one.
	first := evs[0].at.Sub(start)
	if spread := evs[len(evs)-1].at.Sub(evs[0].at); total < 70*time.Millisecond || spread < 60*time.Millisecond {
		t.Fatalf("first chunk at %v, last-first %v, total %v", first, spread, total)
	}
	var content strings.Builder
	var tokens int
	var u *usage
	for i, e := range evs[:len(evs)-1] {
		var c completion
		if err := json.Unmarshal([]byte(e.data), &c); err != nil {
			t.Fatalf("event %d %q: %v", i, e.data, err)
		}
		if c.Object != "chat.completion.chunk" || c.Model != "sim-test" || !strings.HasPrefix(c.ID, "chatcmpl-") {
			t.Fatalf("event %d: %q", i, e.data)
		}
		if len(c.Choices) == 0 {
			if i != len(evs)-2 || c.Usage == nil {
				t.Fatalf("usage chunk misplaced: %d %q", i, e.data)
			}
			u = c.Usage
			continue
		}
		if !strings.Contains(e.data, `"usage":null`) {
			t.Fatalf("include_usage: chunk without usage:null: %q", e.data)
		}
		ch := c.Choices[0]
		if i == 0 {
			if ch.Delta.Role != "assistant" {
				t.Fatalf("first chunk not the role: %q", e.data)
			}
			continue
		}
		if ch.Delta.Content == nil {
			t.Fatalf("no content: %q", e.data)
		}
		tokens++
		content.WriteString(*ch.Delta.Content)
		last := i == len(evs)-3
		if last != (ch.FinishReason != nil) || (last && *ch.FinishReason != "length") {
			t.Fatalf("finish_reason on event %d: %q", i, e.data)
		}
	}
	if tokens != 40 || content.Len() != 40*BytesPerToken {
		t.Fatalf("tokens %d content %q", tokens, content.String())
	}
	// "<|system|>be brief\n<|user|>hello\n" is 33 bytes = 9 tokens.
	if u == nil || u.PromptTokens != 9 || u.CompletionTokens != 40 || u.TotalTokens != 49 {
		t.Fatalf("usage %+v", u)
	}
}

func TestStreamingCompletionsNoUsage(t *testing.T) {
	_, url := startReplica(t, nil)
	evs := streamReq(context.Background(), t, url, "/v1/completions", map[string]any{
		"prompt": "abc", "max_tokens": 5, "ignore_eos": true,
	})
	if len(evs) != 6 || evs[5].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	for _, e := range evs[:5] {
		if strings.Contains(e.data, "usage") || !strings.Contains(e.data, `"object":"text_completion"`) {
			t.Fatalf("chunk %q", e.data)
		}
		var c completion
		if err := json.Unmarshal([]byte(e.data), &c); err != nil || len(c.Choices[0].Text) != BytesPerToken {
			t.Fatalf("chunk %q: %v", e.data, err)
		}
	}
}

func TestMaxTokens(t *testing.T) {
	_, url := startReplica(t, nil)
	c := complete(t, url, map[string]any{"prompt": "hello world", "max_tokens": 7, "ignore_eos": true})
	if c.Usage.CompletionTokens != 7 || len(c.Choices[0].Text) != 7*BytesPerToken || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("%+v", c)
	}
	if c.Usage.PromptTokens != 3 || c.Object != "text_completion" {
		t.Fatalf("%+v", c)
	}
	c = complete(t, url, map[string]any{
		"messages":              []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}},
		"max_completion_tokens": 5, "max_tokens": 50, "ignore_eos": true,
	})
	if c.Usage.CompletionTokens != 5 || c.Choices[0].Message.Role != "assistant" || len(c.Choices[0].Message.Content) != 20 {
		t.Fatalf("%+v", c)
	}
	// Without ignore_eos: a deterministic length in [max/2, max].
	body := map[string]any{"prompt": "stop early please", "max_tokens": 60}
	a := complete(t, url, body)
	b := complete(t, url, body)
	n := a.Usage.CompletionTokens
	if n < 30 || n > 60 || n != b.Usage.CompletionTokens {
		t.Fatalf("early stop %d vs %d", n, b.Usage.CompletionTokens)
	}
	if n < 60 && *a.Choices[0].FinishReason != "stop" {
		t.Fatalf("finish %q", *a.Choices[0].FinishReason)
	}
	// Default max_tokens is 256.
	c = complete(t, url, map[string]any{"prompt": "x", "ignore_eos": true})
	if c.Usage.CompletionTokens != 256 {
		t.Fatalf("default max_tokens: %d", c.Usage.CompletionTokens)
	}
	// Token-id prompts count one token per id.
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = i * 1000
	}
	c = complete(t, url, map[string]any{"prompt": ids, "max_tokens": 1})
	if c.Usage.PromptTokens != 40 {
		t.Fatalf("token ids: %+v", c.Usage)
	}
}

func TestCachedTokens(t *testing.T) {
	rep, url := startReplica(t, nil)
	p := prompt("a", 6*64+2) // 6 whole blocks + 2 bytes: 97 tokens
	body := map[string]any{"prompt": p, "max_tokens": 3, "ignore_eos": true}
	c1 := complete(t, url, body)
	c2 := complete(t, url, body)
	if c1.Usage.PromptTokens != 97 || c1.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("first %+v", c1.Usage)
	}
	if c2.Usage.PromptTokensDetails.CachedTokens != 96 {
		t.Fatalf("second cached %d, want 96", c2.Usage.PromptTokensDetails.CachedTokens)
	}
	// A prompt of exactly 8 whole blocks hits 7: the last token is always
	// recomputed (as in vLLM).
	q := map[string]any{"prompt": prompt("b", 8*64), "max_tokens": 1}
	complete(t, url, q)
	if got := complete(t, url, q).Usage.PromptTokensDetails.CachedTokens; got != 112 {
		t.Fatalf("exact blocks: cached %d, want 112", got)
	}
	// Chat: the same conversation extended by a turn hits the old prefix.
	msgs := []map[string]any{{"role": "system", "content": prompt("sys", 300)}, {"role": "user", "content": "q1"}}
	complete(t, url, map[string]any{"messages": msgs, "max_tokens": 1})
	msgs = []map[string]any{msgs[0], msgs[1], {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}}
	c := complete(t, url, map[string]any{"messages": msgs, "max_tokens": 1})
	// "<|system|>"+300 bytes+"\n<|user|>q1\n" = 323 bytes: 5 whole blocks.
	if c.Usage.PromptTokensDetails.CachedTokens != 80 {
		t.Fatalf("chat prefix cached %d", c.Usage.PromptTokensDetails.CachedTokens)
	}
	st := rep.Stats()
	if st.HitTokens != 96+112+80 || st.Requests != 6 || st.Finished != 6 || st.PinnedBlocks != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOnlyLeadingBlocksHit(t *testing.T) {
	_, url := startReplica(t, nil)
	p := []byte(prompt("lead", 6*64+2))
	complete(t, url, map[string]any{"prompt": string(p), "max_tokens": 1})
	q := append([]byte(nil), p...)
	q[64+10] = '#' // block 1 differs
	c := complete(t, url, map[string]any{"prompt": string(q), "max_tokens": 1})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 16 {
		t.Fatalf("differs in block 1: cached %d, want 16", got)
	}
	r := append([]byte(nil), p...)
	r[3*64] = '#' // block 3 differs; blocks 4, 5 equal but must not hit
	c = complete(t, url, map[string]any{"prompt": string(r), "max_tokens": 1})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 48 {
		t.Fatalf("differs in block 3: cached %d, want 48", got)
	}
	s := append([]byte(nil), p[:5*64+10]...) // shorter: 5 whole blocks
	c = complete(t, url, map[string]any{"prompt": string(s), "max_tokens": 1})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 80 {
		t.Fatalf("prefix: cached %d, want 80", got)
	}
}

func TestLRUEviction(t *testing.T) {
	rep, url := startReplica(t, func(c *Config) { c.NumGPUBlocks = 20 })
	run := func(name string) int {
		// 8 whole blocks + 2 bytes = 129 tokens = 9 blocks.
		c := complete(t, url, map[string]any{"prompt": prompt(name, 8*64+2), "max_tokens": 1})
		return c.Usage.PromptTokensDetails.CachedTokens
	}
	run("x")
	run("y")
	run("z") // needs 9 blocks, 4 free: evicts x's last 5 blocks (LRU, tail first)
	if got := run("y"); got != 128 {
		t.Fatalf("y cached %d, want 128", got)
	}
	if got := run("x"); got != 48 {
		t.Fatalf("x cached %d, want 48 (3 leading blocks left)", got)
	}
	if st := rep.Stats(); st.PinnedBlocks != 0 || st.KVUsage != 0 || st.CachedBlocks+st.PinnedBlocks > 20 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPinnedBlocksNotEvictedAndAdmission(t *testing.T) {
	rep, url := startReplica(t, func(c *Config) { c.NumGPUBlocks = 20 })
	ctx := context.Background()
	var wg sync.WaitGroup
	var aEvs, bEvs []event
	wg.Add(1)
	go func() {
		defer wg.Done()
		// 129 tokens (9 blocks) + 30 output: holds 9..10 blocks for ~60 ms.
		aEvs = streamReq(ctx, t, url, "/v1/completions", map[string]any{
			"prompt": prompt("A", 8*64+2), "max_tokens": 30, "ignore_eos": true})
	}()
	waitFor(t, func() bool { return rep.Stats().Running == 1 })
	wg.Add(1)
	finishedAtB := int64(-1)
	go func() {
		defer wg.Done()
		// 193 tokens = 13 blocks > 11 available while A runs.
		bEvs = streamReq(ctx, t, url, "/v1/completions", map[string]any{
			"prompt": prompt("B", 12*64+2), "max_tokens": 2, "ignore_eos": true},
			func(i int) {
				if i == 0 {
					finishedAtB = rep.Stats().Finished
				}
			})
	}()
	waitFor(t, func() bool { return rep.Stats().Waiting == 1 })
	if st := rep.Stats(); st.Running != 1 || st.KVUsage < 9.0/20 {
		t.Fatalf("while A runs: %+v", st)
	}
	wg.Wait()
	if len(aEvs) != 31 || len(bEvs) != 3 {
		t.Fatalf("events %d %d", len(aEvs), len(bEvs))
	}
	if finishedAtB < 1 {
		t.Fatal("B started before A released its blocks")
	}
	// A left 9 cached blocks (8 of its prompt, 1 of prompt and answer); B
	// evicted the last two: A now hits 7.
	c := complete(t, url, map[string]any{"prompt": prompt("A", 8*64+2), "max_tokens": 1})
	if got := c.Usage.PromptTokensDetails.CachedTokens; got != 112 {
		t.Fatalf("A cached %d, want 112", got)
	}
}

func TestQueueingMaxNumSeqs(t *testing.T) {
	rep, url := startReplica(t, func(c *Config) { c.MaxNumSeqs = 1 })
	ctx := context.Background()
	var wg sync.WaitGroup
	var a, b []event
	wg.Add(2)
	go func() {
		defer wg.Done()
		a = streamReq(ctx, t, url, "/v1/completions", map[string]any{"prompt": "first", "max_tokens": 20, "ignore_eos": true})
	}()
	waitFor(t, func() bool { return rep.Stats().Running == 1 })
	finishedAtB := int64(-1)
	go func() {
		defer wg.Done()
		b = streamReq(ctx, t, url, "/v1/completions", map[string]any{"prompt": "second", "max_tokens": 5, "ignore_eos": true},
			func(i int) {
				if i == 0 {
					finishedAtB = rep.Stats().Finished
				}
			})
	}()
	waitFor(t, func() bool { st := rep.Stats(); return st.Waiting == 1 || st.Finished > 0 })
	if st := rep.Stats(); st.Finished == 0 && st.Running != 1 {
		t.Fatalf("max_num_seqs exceeded: %+v", st)
	}
	wg.Wait()
	if len(a) != 21 || len(b) != 6 {
		t.Fatalf("events %d %d", len(a), len(b))
	}
	if finishedAtB < 1 {
		t.Fatal("second request's first token came before the first request finished")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	rep, url := startReplica(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, _ := json.Marshal(map[string]any{"prompt": prompt("long", 1000), "max_tokens": 10000, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(js))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("%q %v", line, err)
	}
	if st := rep.Stats(); st.Running != 1 || st.PinnedBlocks == 0 {
		t.Fatalf("not running: %+v", st)
	}
	cancel()
	_ = resp.Body.Close()
	waitFor(t, func() bool {
		st := rep.Stats()
		return st.Aborted == 1 && st.Running == 0 && st.Waiting == 0 && st.PinnedBlocks == 0
	})
	// Non-streaming requests abort too, also while waiting.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	js, _ = json.Marshal(map[string]any{"prompt": "x", "max_tokens": 10000, "ignore_eos": true})
	req, _ = http.NewRequestWithContext(ctx2, "POST", url+"/v1/completions", bytes.NewReader(js))
	if resp, err := client.Do(req); err == nil {
		_ = resp.Body.Close()
		t.Fatal("expected timeout")
	}
	waitFor(t, func() bool {
		st := rep.Stats()
		return st.Aborted == 2 && st.Running == 0 && st.PinnedBlocks == 0
	})
	if st := rep.Stats(); st.Finished != 0 || st.GeneratedTokens >= 10000 {
		t.Fatalf("%+v", st)
	}
}

func TestPreemption(t *testing.T) {
	rep, url := startReplica(t, func(c *Config) { c.NumGPUBlocks = 12 })
	var wg sync.WaitGroup
	res := make([]completion, 3)
	for i := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 49 tokens (4 blocks) growing to 149 (10 blocks): three cannot
			// all fit in 12 blocks.
			res[i] = complete(t, url, map[string]any{"prompt": prompt(fmt.Sprint("p", i), 3*64+2), "max_tokens": 100, "ignore_eos": true})
		}()
	}
	wg.Wait()
	for i, c := range res {
		if c.Usage == nil || c.Usage.CompletionTokens != 100 {
			t.Fatalf("request %d: %+v", i, c.Usage)
		}
	}
	st := rep.Stats()
	if st.Preemptions == 0 || st.PinnedBlocks != 0 || st.Finished != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestErrorsModelsHealth(t *testing.T) {
	_, url := startReplica(t, nil)
	code, body := post(t, url, "/v1/chat/completions", `{"messages": [`)
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if code != 400 || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" || e.Error.Code == nil {
		t.Fatalf("%d %s", code, body)
	}
	code, body = post(t, url, "/v1/completions", map[string]any{"model": "other", "prompt": "x"})
	if code != 404 || json.Unmarshal(body, &e) != nil || !strings.Contains(e.Error.Message, "other") {
		t.Fatalf("%d %s", code, body)
	}
	for _, bad := range []map[string]any{
		{"prompt": "x", "max_tokens": 0},
		{"prompt": ""},
		{"prompt": "x", "max_tokens": 1 << 20},
	} {
		if code, body := post(t, url, "/v1/completions", bad); code != 400 {
			t.Fatalf("%v: %d %s", bad, code, body)
		}
	}
	if code, body := post(t, url, "/v1/chat/completions", map[string]any{"messages": []any{}}); code != 400 {
		t.Fatalf("empty messages: %d %s", code, body)
	}
	resp, err := get(t, url+"/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&m)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Data) != 1 || m.Data[0].ID != "sim-test" {
		t.Fatalf("models %+v", m)
	}
	resp, err = get(t, url+"/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v %v", resp, err)
	}
	_ = resp.Body.Close()
}

func TestMetrics(t *testing.T) {
	rep, url := startReplica(t, nil)
	p := prompt("m", 4*64)
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 2, "ignore_eos": true})
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 2, "ignore_eos": true})
	vals, labels := scrape(t, url)
	value := func(name string) float64 {
		t.Helper()
		samples, ok := labels[name]
		if !ok {
			t.Fatalf("missing %s", name)
		}
		for _, l := range samples {
			if l["model_name"] != "sim-test" {
				t.Fatalf("%s without model_name", name)
			}
		}
		return vals[name]
	}
	st := rep.Stats()
	checks := map[string]float64{
		"vllm:num_requests_waiting":       0,
		"vllm:num_requests_running":       0,
		"vllm:kv_cache_usage_perc":        0,
		"vllm:cache_config_info":          1,
		"vllm:prefix_cache_hits_total":    48,
		"vllm:prefix_cache_queries_total": 128,
		"vllm:prompt_tokens_total":        128,
		"vllm:generation_tokens_total":    4,
		"vllm:request_success_total":      2,
	}
	for name, want := range checks {
		if got := value(name); got != want {
			t.Errorf("%s = %v, want %v (stats %+v)", name, got, want, st)
		}
	}
	if cc := labels["vllm:cache_config_info"][0]; cc["block_size"] != "16" || cc["num_gpu_blocks"] != "1000" {
		t.Fatalf("cache_config_info labels %v", cc)
	}
}

// scrape fetches /metrics and returns, per family, the sum of its samples'
// values and each sample's labels.
func scrape(t *testing.T, url string) (map[string]float64, map[string][]map[string]string) {
	t.Helper()
	resp, err := get(t, url+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]float64{}
	labels := map[string][]map[string]string{}
	for name, f := range fams {
		for _, m := range f.Metric {
			switch {
			case m.Gauge != nil:
				vals[name] += m.Gauge.GetValue()
			case m.Counter != nil:
				vals[name] += m.Counter.GetValue()
			}
			l := map[string]string{}
			for _, p := range m.Label {
				l[p.GetName()] = p.GetValue()
			}
			labels[name] = append(labels[name], l)
		}
	}
	return vals, labels
}

func TestTimeScale(t *testing.T) {
	run := func(scale float64) time.Duration {
		_, url := startReplica(t, func(c *Config) { c.TimeScale = scale; c.StepBaseMs = 5 })
		start := time.Now()
		complete(t, url, map[string]any{"prompt": "x", "max_tokens": 30, "ignore_eos": true})
		return time.Since(start)
	}
	// 30 steps of 5 ms. Sleeps only get longer on a busy machine, so the
	// lower bound is strict and the speed-up gets a few attempts.
	for attempt := 0; ; attempt++ {
		slow, fast := run(1), run(0.1)
		t.Logf("scale 1: %v, scale 0.1: %v", slow, fast)
		if slow < 150*time.Millisecond {
			t.Fatalf("scale 1 ran too fast: %v", slow)
		}
		if fast < slow/3 {
			return
		}
		if attempt == 2 {
			t.Fatalf("no speed-up: scale 1: %v, scale 0.1: %v", slow, fast)
		}
	}
}

func TestFleet(t *testing.T) {
	f, err := StartFleet(context.Background(), 3, 0, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	for i, u := range f.URLs {
		c := complete(t, u, map[string]any{"prompt": "hi", "max_tokens": 1})
		seen[c.ID[:strings.LastIndex(c.ID, "-")]] = true
		if f.Replicas[i].Stats().Requests != 1 {
			t.Fatalf("replica %d did not serve", i)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("ids %v", seen)
	}
	f.Close()
	if resp, err := get(t, f.URLs[0]+"/health"); err == nil {
		_ = resp.Body.Close()
		t.Fatal("fleet still serving after Close")
	}
}

// TestPinnedBlockMS: every step of a lone request holds its prompt's
// blocks and at most the few its answer adds, so the pinned block time
// lies between those counts times the busy time, and idle time adds
// nothing.
func TestPinnedBlockMS(t *testing.T) {
	rep, url := startReplica(t, nil)
	const promptBlocks, answer = 64, 32
	bs := rep.cfg.BlockSize
	complete(t, url, map[string]any{"prompt": prompt("pin", promptBlocks*bs*BytesPerToken), "max_tokens": answer, "ignore_eos": true})
	st := rep.Stats()
	busy := float64(st.BusyTime) / float64(time.Millisecond)
	lo, hi := float64(promptBlocks)*busy, float64(promptBlocks+answer/bs+1)*busy
	if busy <= 0 || st.PinnedBlockMS < lo || st.PinnedBlockMS > hi {
		t.Fatalf("pinned %.1f block-ms over %.1f busy ms: want within [%.1f, %.1f]", st.PinnedBlockMS, busy, lo, hi)
	}
	time.Sleep(20 * time.Millisecond)
	if again := rep.Stats(); again.PinnedBlockMS != st.PinnedBlockMS || again.PinnedBlocks != 0 {
		t.Fatalf("idle: pinned %.1f block-ms (was %.1f), %d blocks pinned", again.PinnedBlockMS, st.PinnedBlockMS, again.PinnedBlocks)
	}
}

// TestArrivalsSeeTheFleet: a request counts what its replica held of its
// prompt as it arrived and the most any replica of the fleet held then,
// both short of the last token as admission counts hits.
func TestArrivalsSeeTheFleet(t *testing.T) {
	f, err := StartFleet(context.Background(), 2, 0, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const blocks = 64
	bs := f.Replicas[0].Config().BlockSize
	p := map[string]any{"prompt": prompt("arrive", blocks*bs*BytesPerToken), "max_tokens": 1}
	held := (blocks - 1) * bs
	complete(t, f.URLs[0], p) // nothing cached anywhere yet
	complete(t, f.URLs[1], p) // replica 0 holds it, replica 1 does not
	complete(t, f.URLs[0], p) // both hold it
	for i, want := range [][2]int64{{int64(held), int64(held)}, {0, int64(held)}} {
		st := f.Replicas[i].Stats()
		if got := [2]int64{st.ArrivalHeldTokens, st.ArrivalBestTokens}; got != want {
			t.Errorf("replica %d: held %d of best %d at arrival, want %d of %d", i, got[0], got[1], want[0], want[1])
		}
	}
	alone, url := startReplica(t, nil) // a fleet of one: what it holds is the most
	complete(t, url, p)
	complete(t, url, p)
	if st := alone.Stats(); st.ArrivalHeldTokens != int64(held) || st.ArrivalBestTokens != int64(held) {
		t.Errorf("a fleet of one: held %d of best %d, want %d of %d", st.ArrivalHeldTokens, st.ArrivalBestTokens, held, held)
	}
}
