package sim

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestTokenIDs(t *testing.T) {
	p := []byte("abcdefg") // one whole token and a partial one
	ids := TokenIDs(p)
	want := []uint32{0x64636261, 0x00676665}
	if !slices.Equal(ids, want) {
		t.Fatalf("TokenIDs = %#x, want %#x", ids, want)
	}
	if back := TokenBytes(ids); !bytes.Equal(back, []byte("abcdefg\x00")) {
		t.Fatalf("TokenBytes = %q", back)
	}
	whole := []byte("\x00\xff\x10\x80wxyz")
	if back := TokenBytes(TokenIDs(whole)); !bytes.Equal(back, whole) {
		t.Fatalf("round trip of whole tokens = %q", back)
	}
	if len(TokenIDs(nil)) != 0 {
		t.Fatal("tokens of nothing")
	}
}

// renderIDs posts a render request and returns its token ids.
func renderIDs(t *testing.T, url string, chat bool, body map[string]any) []uint32 {
	t.Helper()
	path := "/v1/completions/render"
	if chat {
		path = "/v1/chat/completions/render"
	}
	code, out := post(t, url, path, body)
	if code != 200 {
		t.Fatalf("%s: status %d: %s", path, code, out)
	}
	var res renderResult
	if chat {
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	} else {
		var list []renderResult
		if err := json.Unmarshal(out, &list); err != nil || len(list) != 1 {
			t.Fatalf("%v: %s", err, out)
		}
		res = list[0]
	}
	if res.Model != "sim-test" || res.RequestID == "" || res.SamplingParams.MaxTokens < 1 {
		t.Fatalf("render result %s", out)
	}
	return res.TokenIDs
}

func wireMessages(msgs []Message) []map[string]any {
	wire := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		wire[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	return wire
}

// cachedRun is the number of leading whole blocks of the token ids ids
// that the replica's GPU cache holds, hashed the replica's way.
func cachedRun(r *Replica, ids []uint32) int {
	keys := blockKeys(TokenBytes(ids), r.cfg.BlockSize)
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.cache.lookup(keys, len(keys)))
}

// TestRenderMatchesCache: the token ids a render returns, cut in blocks
// and hashed as the replica hashes prompts, are the keys the request
// stores; the next turn's render predicts exactly the cached tokens the
// replica then reports.
func TestRenderMatchesCache(t *testing.T) {
	rep, url := startReplica(t, nil)
	bs := rep.cfg.BlockSize
	msgs := []Message{
		{Role: "system", Content: prompt("sys", 300)},
		{Role: "user", Content: prompt("question", 211)},
	}
	ids := renderIDs(t, url, true, map[string]any{"messages": wireMessages(msgs), "max_tokens": 40})
	if !slices.Equal(ids, TokenIDs(RenderChat(msgs))) {
		t.Fatal("chat render differs from the replica's rendering")
	}
	if n := cachedRun(rep, ids); n != 0 {
		t.Fatalf("%d blocks cached before any request", n)
	}
	answer, u, err := chatTurn(t.Context(), url, msgs, 40, false)
	if err != nil {
		t.Fatal(err)
	}
	if u.PromptTokens != len(ids) {
		t.Fatalf("prompt_tokens %d, rendered %d", u.PromptTokens, len(ids))
	}
	if n, whole := cachedRun(rep, ids), len(ids)/bs; n != whole || whole < 8 {
		t.Fatalf("%d of the rendered prompt's %d whole blocks cached", n, whole)
	}

	next := append(slices.Clone(msgs), Message{Role: "assistant", Content: answer}, Message{Role: "user", Content: prompt("more", 90)})
	ids2 := renderIDs(t, url, true, map[string]any{"messages": wireMessages(next)})
	if !slices.Equal(ids2[:len(ids)-1], ids[:len(ids)-1]) {
		t.Fatal("the next turn's render does not extend this one's")
	}
	predicted := min(cachedRun(rep, ids2), (len(ids2)-1)/bs) * bs
	if predicted <= len(ids)/bs*bs {
		t.Fatalf("predicted %d cached tokens: the answer's blocks are not cached", predicted)
	}
	_, u2, err := chatTurn(t.Context(), url, next, 8, false)
	if err != nil {
		t.Fatal(err)
	}
	if u2.PromptTokens != len(ids2) || u2.PromptTokensDetails.CachedTokens != predicted {
		t.Fatalf("turn 2: prompt %d cached %d; rendered %d, predicted %d",
			u2.PromptTokens, u2.PromptTokensDetails.CachedTokens, len(ids2), predicted)
	}

	// Completions: a text prompt renders to its bytes' ids, a token-id
	// prompt to its ids as given, and both key the same blocks.
	text := prompt("plain", 333)
	pids := renderIDs(t, url, false, map[string]any{"prompt": text, "max_tokens": 4})
	if !slices.Equal(pids, TokenIDs([]byte(text))) {
		t.Fatal("completions render differs from the prompt's ids")
	}
	whole := pids[:len(pids)/bs*bs]
	if got := renderIDs(t, url, false, map[string]any{"prompt": whole}); !slices.Equal(got, whole) {
		t.Fatal("a token-id prompt does not render to its ids")
	}
	c := complete(t, url, map[string]any{"prompt": text, "max_tokens": 4, "ignore_eos": true})
	if c.Usage.PromptTokens != len(pids) || cachedRun(rep, whole) != len(whole)/bs {
		t.Fatalf("prompt_tokens %d of %d rendered; %d of %d blocks cached", c.Usage.PromptTokens, len(pids), cachedRun(rep, whole), len(whole)/bs)
	}
	c = complete(t, url, map[string]any{"prompt": whole, "max_tokens": 4, "ignore_eos": true})
	if c.Usage.PromptTokensDetails.CachedTokens != len(whole)-bs {
		t.Fatalf("token-id prompt of the same blocks: cached %d, want %d", c.Usage.PromptTokensDetails.CachedTokens, len(whole)-bs)
	}
	if st := rep.Stats(); st.Rejected != 0 || st.Requests != 4 {
		t.Fatalf("renders counted as requests: %+v", st)
	}
}

type tokenizeResult struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func TestTokenize(t *testing.T) {
	rep, url := startReplica(t, nil)
	tokenize := func(body any) tokenizeResult {
		t.Helper()
		code, out := post(t, url, "/tokenize", body)
		if code != 200 {
			t.Fatalf("status %d: %s", code, out)
		}
		var res tokenizeResult
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if res.MaxModelLen != rep.cfg.MaxModelLen || res.Count != len(res.Tokens) {
			t.Fatalf("tokenize %s", out)
		}
		return res
	}
	msgs := []Message{{Role: "user", Content: "hello there"}}
	res := tokenize(map[string]any{"model": "sim-test", "messages": wireMessages(msgs)})
	if !slices.Equal(res.Tokens, TokenIDs(RenderChat(msgs))) || res.TokenStrs != nil {
		t.Fatalf("messages: %+v", res)
	}
	res = tokenize(map[string]any{"prompt": "hello world", "return_token_strs": true})
	if !slices.Equal(res.Tokens, TokenIDs([]byte("hello world"))) || res.Count != 3 ||
		strings.Join(res.TokenStrs, "|") != "hell|o wo|rld" {
		t.Fatalf("prompt: %+v", res)
	}
	// Tools render before the messages, as in a chat request.
	res = tokenize(map[string]any{"messages": wireMessages(msgs), "tools": []any{map[string]any{"type": "function"}}})
	if !bytes.HasPrefix(TokenBytes(res.Tokens), []byte(`<|tools|>[{"type":"function"}]`+"\n<|user|>hello there\n")) {
		t.Fatalf("tools: %q", TokenBytes(res.Tokens))
	}
}

// TestRenderBadInput: malformed render and tokenize requests get an
// OpenAI-style 400 (404 for another model), counted as no request.
func TestRenderBadInput(t *testing.T) {
	rep, url := startReplica(t, func(c *Config) { c.MaxModelLen = 200 })
	cases := []struct {
		path string
		body any
		want int
	}{
		{"/v1/chat/completions/render", `{"messages": [`, 400},
		{"/v1/chat/completions/render", map[string]any{"messages": []any{}}, 400},
		{"/v1/chat/completions/render", map[string]any{"messages": []any{map[string]any{"content": "x"}}}, 400},
		{"/v1/chat/completions/render", map[string]any{"messages": wireMessages([]Message{{"user", "x"}}), "max_tokens": 500}, 400},
		{"/v1/chat/completions/render", map[string]any{"model": "other", "messages": wireMessages([]Message{{"user", "x"}})}, 404},
		{"/v1/completions/render", map[string]any{}, 400},
		{"/v1/completions/render", map[string]any{"prompt": 7}, 400},
		{"/v1/completions/render", map[string]any{"prompt": []any{-1}}, 400},
		{"/tokenize", `not json`, 400},
		{"/tokenize", map[string]any{}, 400},
		{"/tokenize", map[string]any{"prompt": "x", "messages": wireMessages([]Message{{"user", "x"}})}, 400},
		{"/tokenize", map[string]any{"messages": []any{}}, 400},
		{"/tokenize", map[string]any{"model": "other", "prompt": "x"}, 404},
	}
	for _, tc := range cases {
		code, out := post(t, url, tc.path, tc.body)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out, &e); err != nil || code != tc.want || e.Error.Message == "" || e.Error.Type != "invalid_request_error" || e.Error.Code == "" {
			t.Errorf("%s %v: status %d (want %d): %s", tc.path, tc.body, code, tc.want, out)
		}
	}
	if st := rep.Stats(); st.Rejected != 0 || st.Requests != 0 {
		t.Fatalf("bad renders counted: %+v", st)
	}
}

// TestResetPrefixCache: a reset empties the cache (the same prompt then
// hits nothing); it is refused while a request holds blocks.
func TestResetPrefixCache(t *testing.T) {
	rep, url := startReplica(t, nil)
	p := prompt("reset", 500)
	complete(t, url, map[string]any{"prompt": p, "max_tokens": 2})
	if c := complete(t, url, map[string]any{"prompt": p, "max_tokens": 2}); c.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("no hit before the reset")
	}
	if code, out := post(t, url, "/reset_prefix_cache", ""); code != 200 {
		t.Fatalf("reset: %d %s", code, out)
	}
	if st := rep.Stats(); st.CachedBlocks != 0 || st.PinnedBlocks != 0 {
		t.Fatalf("after reset: %+v", st)
	}
	checkCache(t, rep)
	if c := complete(t, url, map[string]any{"prompt": p, "max_tokens": 2}); c.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("hit %d tokens after the reset", c.Usage.PromptTokensDetails.CachedTokens)
	}

	// A request in flight holds its blocks: the reset is refused.
	rep.mu.Lock()
	b := rep.cache.alloc()
	rep.mu.Unlock()
	if code, out := post(t, url, "/reset_prefix_cache", ""); code != 409 || rep.Stats().CachedBlocks == 0 {
		t.Fatalf("reset with a pinned block: %d %s", code, out)
	}
	rep.mu.Lock()
	rep.cache.release(b)
	rep.mu.Unlock()
	if !rep.ResetPrefixCache() {
		t.Fatal("reset refused with nothing pinned")
	}
}

// TestAppendRender: the hand-written answer is the bytes json.Marshal
// writes, for results with and without every optional part.
func TestAppendRender(t *testing.T) {
	seed := int64(-7)
	for _, tc := range []struct {
		name string
		res  renderResult
	}{
		{"zero", renderResult{}},
		{"no tokens", renderResult{RequestID: "cmpl-x", TokenIDs: []uint32{}}},
		{"one token", renderResult{RequestID: "chatcmpl-a\"b<", TokenIDs: []uint32{0}}},
		{"full", renderResult{
			RequestID: "chatcmpl-sim-0-render-12",
			TokenIDs:  []uint32{1, 0x64636261, 4294967295, 10},
			renderRest: renderRest{
				SamplingParams: samplingParams{MaxTokens: 5, MinTokens: 2, IgnoreEOS: true, Seed: &seed},
				Model:          "sim-test",
				Stream:         true,
				StreamOptions:  &streamOptions{IncludeUsage: true},
				Priority:       3,
			},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := json.Marshal(&tc.res)
			if err != nil {
				t.Fatal(err)
			}
			if got := appendRender([]byte("prefix"), &tc.res); string(got) != "prefix"+string(want) {
				t.Fatalf("appendRender = %s\nwant %s", got[len("prefix"):], want)
			}
		})
	}
}
