package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/internal/race"
	"github.com/kvroute/kvroute/oai"
)

func newTok(tb testing.TB, opts Options) *Tokenizer {
	tb.Helper()
	tk, err := New(opts)
	if err != nil {
		tb.Fatalf("New(%+v): %v", opts, err)
	}
	return tk
}

func text(s string) oai.Part  { return oai.Part{Text: s, IsText: true} }
func image(h uint64) oai.Part { return oai.Part{Hash: h} }
func msg(role string, parts ...oai.Part) oai.Message {
	return oai.Message{Role: role, Parts: parts}
}

func chat(msgs ...oai.Message) *oai.Request {
	return &oai.Request{Kind: oai.KindChat, Messages: msgs}
}

func TestNewOptions(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr string
		wantEnc string
	}{
		{"zero value", Options{}, "", EncodingCL100K},
		{"cl100k", Options{Encoding: "cl100k_base"}, "", EncodingCL100K},
		{"o200k", Options{Encoding: "o200k_base"}, "", EncodingO200K},
		{"unknown encoding", Options{Encoding: "p50k_base"}, "unknown encoding", ""},
		{"typo", Options{Encoding: "cl100k"}, "unknown encoding", ""},
		{"negative chunk", Options{ChunkBytes: -1}, "ChunkBytes", ""},
		{"tiny chunk", Options{ChunkBytes: 10}, "ChunkBytes", ""},
		{"min chunk", Options{ChunkBytes: MinChunkBytes}, "", EncodingCL100K},
		{"caches off", Options{CacheBytes: -1}, "", EncodingCL100K},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk, err := New(tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tk.Encoding() != tt.wantEnc {
				t.Fatalf("Encoding() = %q, want %q", tk.Encoding(), tt.wantEnc)
			}
		})
	}
}

// TestEncodeKnownTokens pins a few token IDs of both encodings.
func TestEncodeKnownTokens(t *testing.T) {
	tests := []struct {
		enc  string
		text string
		want []uint32
	}{
		{EncodingCL100K, "hello world", []uint32{15339, 1917}},
		{EncodingO200K, "hello world", []uint32{24912, 2375}},
		{EncodingCL100K, "", nil},
	}
	for _, tt := range tests {
		tk := newTok(t, Options{Encoding: tt.enc})
		if got := tk.Encode(nil, tt.text); !slices.Equal(got, tt.want) {
			t.Errorf("%s Encode(%q) = %v, want %v", tt.enc, tt.text, got, tt.want)
		}
	}
}

// conversation returns a growing chat: system prompt, then alternating
// user/assistant turns, some long (several chunks), some with images.
func conversation(turns int) []oai.Message {
	docs := genDoc(5, 16000)
	prefix := func(n int) string {
		for !utf8.RuneStart(docs[n]) {
			n--
		}
		return docs[:n]
	}
	// A system prompt long enough for the message cache (minCachedText).
	msgs := []oai.Message{msg("system", text("You are a helpful assistant. Answer briefly, cite the document you were given, "+
		"and say so when it does not hold the answer; never make up a source.\n"))}
	for i := 1; i <= turns; i++ {
		switch {
		case i%2 == 1 && i%3 == 0:
			msgs = append(msgs, msg("user", text(fmt.Sprintf("Look at image %d:", i)), image(uint64(i)*0x9E3779B97F4A7C15)))
		case i%2 == 1:
			msgs = append(msgs, msg("user", text(fmt.Sprintf("Question %d about this:\n%s", i, prefix(1000*i)))))
		default:
			msgs = append(msgs, msg("assistant", text(strings.Repeat(fmt.Sprintf("Answer %d. ", i), 40*i))))
		}
	}
	return msgs
}

func TestKeyDeterministic(t *testing.T) {
	msgs := conversation(8)
	for _, enc := range encodings {
		reqs := []*oai.Request{
			chat(msgs...),
			{Kind: oai.KindChat, Tools: `[{"type":"function","function":{"name":"get_weather"}}]`, Messages: msgs},
			{Kind: oai.KindCompletion, Prompt: oai.Prompt{Texts: []string{genDoc(1, 5000)}}},
			{Kind: oai.KindEmbedding, Prompt: oai.Prompt{Texts: []string{"a", "b c", genDoc(2, 3000)}}},
			{Kind: oai.KindGenerate, Prompt: oai.Prompt{Tokens: [][]uint32{{1, 2, 3}, {4}}}},
		}
		// Every tokenizer (own hash seeds, caches on or off, cold or warm)
		// gives the same keys.
		tks := []*Tokenizer{
			newTok(t, Options{Encoding: enc}),
			newTok(t, Options{Encoding: enc}),
			newTok(t, Options{Encoding: enc, CacheBytes: -1}),
			newTok(t, Options{Encoding: enc, CacheBytes: 4 << 10}),
		}
		for i, req := range reqs {
			want := tks[0].Key(nil, req)
			if len(want) == 0 {
				t.Fatalf("%s request %d: empty key", enc, i)
			}
			for round := 0; round < 2; round++ {
				for j, tk := range tks {
					if got := tk.Key(nil, req); !slices.Equal(got, want) {
						t.Errorf("%s request %d tokenizer %d round %d: key differs", enc, i, j, round)
					}
				}
			}
		}
	}
}

// TestKeyPrefixGrowingConversation checks that turn N+1's key extends turn
// N's key, and that the key is exactly the concatenation of its messages.
func TestKeyPrefixGrowingConversation(t *testing.T) {
	msgs := conversation(12)
	tools := `[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]`
	for _, enc := range encodings {
		for _, opts := range []Options{{Encoding: enc}, {Encoding: enc, CacheBytes: -1}, {Encoding: enc, ChunkBytes: 256}} {
			tk := newTok(t, opts)
			for _, withTools := range []bool{false, true} {
				var prev []uint32
				if withTools {
					prev = tk.Key(nil, &oai.Request{Tools: tools})
				}
				for n := 1; n <= len(msgs); n++ {
					req := chat(msgs[:n]...)
					if withTools {
						req.Tools = tools
					}
					key := tk.Key(nil, req)
					if !slices.Equal(key[:len(prev)], prev) {
						t.Fatalf("%+v tools=%v: key of %d messages does not extend key of %d", opts, withTools, n, n-1)
					}
					// The new message's part is what one message alone renders to.
					alone := tk.Key(nil, chat(msgs[n-1]))
					if !slices.Equal(key[len(prev):], alone) {
						t.Fatalf("%+v: message %d renders differently in context", opts, n-1)
					}
					prev = key
				}
			}
		}
	}
}

// TestEncodePrefixStable checks that chunks depend only on the text: a
// longer text with the same beginning keeps the beginning's tokens, except
// for the last chunk.
func TestEncodePrefixStable(t *testing.T) {
	doc := strings.Join(goDocs(t, 64<<10), "\n") + genDoc(3, 20000)
	tk := newTok(t, Options{CacheBytes: -1})
	full := tk.Encode(nil, doc)
	for _, n := range []int{5000, 10000, 33333, 50001} {
		short := tk.Encode(nil, doc[:n])
		// Chunks wholly before n-ChunkBytes-2 are shared.
		common := 0
		for common < len(short) && short[common] == full[common] {
			common++
		}
		covered := len(decode(tk.v, short[:common]))
		if covered < n-2*DefaultChunkBytes-2 {
			t.Errorf("prefix of %d bytes: keys agree on only %d bytes", n, covered)
		}
	}
}

func TestChunkEnd(t *testing.T) {
	doc := strings.Join(goDocs(t, 32<<10), "\n") + genDoc(4, 20000) + strings.Repeat("x", 5000) + strings.Repeat("日本", 2000)
	for _, size := range []int{64, 100, 2048} {
		for i := 0; i < len(doc); {
			j := chunkEnd(doc, i, size)
			if j <= i || j-i > size {
				t.Fatalf("size %d: chunk [%d,%d)", size, i, j)
			}
			if j < len(doc) && (!utf8.RuneStart(doc[j]) || j-i <= size/2) {
				t.Fatalf("size %d: cut at %d is not a rune boundary or too early", size, j)
			}
			// The cut depends only on the next size+2 bytes.
			if end := i + size + 2; end < len(doc) {
				if k := chunkEnd(doc[:end], i, size); k != j {
					t.Fatalf("size %d: cut at %d depends on text past %d (got %d)", size, j, end, k)
				}
			}
			i = j
		}
	}
}

func TestKeyDistinguishes(t *testing.T) {
	tk := newTok(t, Options{})
	base := chat(msg("system", text("sys")), msg("user", text("Describe:"), image(1)))
	tests := []struct {
		name string
		req  *oai.Request
	}{
		{"other image", chat(msg("system", text("sys")), msg("user", text("Describe:"), image(2)))},
		{"image bit 63", chat(msg("system", text("sys")), msg("user", text("Describe:"), image(1|1<<63)))},
		{"image bit 33", chat(msg("system", text("sys")), msg("user", text("Describe:"), image(1|1<<33)))},
		{"image bit 3", chat(msg("system", text("sys")), msg("user", text("Describe:"), image(1|1<<3)))},
		{"no image", chat(msg("system", text("sys")), msg("user", text("Describe:")))},
		{"other role", chat(msg("developer", text("sys")), msg("user", text("Describe:"), image(1)))},
		{"roles swapped", chat(msg("user", text("sys")), msg("system", text("Describe:"), image(1)))},
		{"merged messages", chat(msg("system", text("sys"), text("Describe:"), image(1)))},
		{"tools", &oai.Request{Tools: "[]", Messages: base.Messages}},
		{"as prompt", &oai.Request{Prompt: oai.Prompt{Texts: []string{"sys", "Describe:"}}}},
	}
	want := tk.Key(nil, base)
	for _, tt := range tests {
		if got := tk.Key(nil, tt.req); slices.Equal(got, want) {
			t.Errorf("%s: same key as the base request", tt.name)
		}
	}
	// Every single-bit change of an image hash changes the key.
	for bit := 0; bit < 64; bit++ {
		h := uint64(0x0123456789ABCDEF)
		a := tk.Key(nil, chat(msg("user", image(h))))
		b := tk.Key(nil, chat(msg("user", image(h^1<<bit))))
		if slices.Equal(a, b) {
			t.Errorf("image hash bit %d does not change the key", bit)
		}
		for _, v := range a[1 : len(a)-1] {
			if v < hashBase {
				t.Errorf("image value %#x below the hash range", v)
			}
		}
	}
}

func TestKeyPrompts(t *testing.T) {
	tk := newTok(t, Options{})
	tests := []struct {
		name string
		a, b *oai.Request
		same bool
	}{
		{"equal prompts", &oai.Request{Prompt: oai.Prompt{Texts: []string{"hello world"}}}, &oai.Request{Kind: oai.KindCompletion, Prompt: oai.Prompt{Texts: []string{"hello world"}}}, true},
		{"equal chats", chat(msg("user", text("hi"))), chat(msg("user", text("hi"))), true},
		{"split list", &oai.Request{Prompt: oai.Prompt{Texts: []string{"hello world"}}}, &oai.Request{Prompt: oai.Prompt{Texts: []string{"hello", " world"}}}, false},
		{"token lists", &oai.Request{Prompt: oai.Prompt{Tokens: [][]uint32{{1, 2}, {3}}}}, &oai.Request{Prompt: oai.Prompt{Tokens: [][]uint32{{1}, {2, 3}}}}, false},
		{"nil and empty", nil, &oai.Request{}, true},
	}
	for _, tt := range tests {
		a, b := tk.Key(nil, tt.a), tk.Key(nil, tt.b)
		if slices.Equal(a, b) != tt.same {
			t.Errorf("%s: keys %v and %v, want same=%v", tt.name, a, b, tt.same)
		}
	}
	got := tk.Key(nil, &oai.Request{Prompt: oai.Prompt{Tokens: [][]uint32{{7, 8}, {9}}}})
	if want := []uint32{7, 8, MarkerSep, 9}; !slices.Equal(got, want) {
		t.Errorf("token prompt key = %v, want %v", got, want)
	}
	got = tk.Key(nil, &oai.Request{Prompt: oai.Prompt{Texts: []string{"hello world", "hello world"}}})
	if want := []uint32{15339, 1917, MarkerSep, 15339, 1917}; !slices.Equal(got, want) {
		t.Errorf("text list key = %v, want %v", got, want)
	}
	// The dst argument is reused, not appended to.
	dst := []uint32{1, 2, 3}
	if got := tk.Key(dst, &oai.Request{Prompt: oai.Prompt{Tokens: [][]uint32{{5}}}}); !slices.Equal(got, []uint32{5}) {
		t.Errorf("Key(dst) = %v, want [5]", got)
	}
}

// TestShortMessagesSkipCache checks that messages shorter than
// minCachedText are tokenized each time rather than cached, and that
// longer ones still are, with the same keys either way.
func TestShortMessagesSkipCache(t *testing.T) {
	tk := newTok(t, Options{})
	plain := newTok(t, Options{CacheBytes: -1})
	short := strings.Repeat("x", minCachedText-1)
	long := strings.Repeat("y", minCachedText)
	for range 2 {
		checkBlocks(t, tk, plain, chat(msg("user", text(short))))
	}
	if st := tk.Stats().Messages; st.Hits != 0 || st.Misses != 0 || st.Entries != 0 {
		t.Errorf("message cache after a short message twice: %+v, want untouched", st)
	}
	for range 2 {
		checkBlocks(t, tk, plain, chat(msg("user", text(long))))
	}
	if st := tk.Stats().Messages; st.Hits != 1 || st.Misses != 1 || st.Entries != 1 {
		t.Errorf("message cache after a long message twice: %+v, want 1 hit, 1 miss, 1 entry", st)
	}
}

func TestCacheHitsOnRepeatedTurns(t *testing.T) {
	tk := newTok(t, Options{})
	plain := newTok(t, Options{CacheBytes: -1})
	msgs := conversation(10)
	for n := 1; n <= len(msgs); n++ {
		req := chat(msgs[:n]...)
		checkBlocks(t, tk, plain, req)
	}
	st := tk.Stats()
	// Turn 1 misses its message; turn 2 finds no earlier turn in the
	// conversation cache, finds message 1 in the message cache and misses
	// message 2; from turn 3 on, each turn finds the previous turn's entry
	// and renders its new message bypassing the message cache.
	if st.Messages.Hits != 1 || st.Messages.Misses != 2 || st.Messages.Entries != 2 {
		t.Errorf("message cache stats %+v, want 1 hit, 2 misses, 2 entries", st.Messages)
	}
	if st.Messages.Bytes <= 0 || st.Messages.Bytes > st.Messages.MaxBytes {
		t.Errorf("message cache stats %+v", st.Messages)
	}
	// Misses: turn 2 probes its whole request and message 1; turn 3 its
	// whole request, then finds turn 2 one message back. Later turns probe
	// one message back first, where the latest hit was, and find it. Each
	// turn of two or more messages leaves an entry.
	turns := len(msgs) - 1
	if c := st.Conversations; c.Hits != uint64(turns-1) || c.Misses != 3 || c.Entries != turns || c.Bytes > c.MaxBytes {
		t.Errorf("conversation cache stats %+v, want %d hits, 3 misses and %d entries", c, turns-1, turns)
	}
	// An exact repeat finds the previous turn where the latest hit was.
	checkBlocks(t, tk, plain, chat(msgs...))
	if c := tk.Stats().Conversations; c.Hits != uint64(turns) || c.Misses != 3 || c.Entries != turns {
		t.Errorf("after a repeat: conversation cache %+v, want %d hits, 3 misses", c, turns)
	}
	// A fork from an earlier turn and an edit of the last message each find
	// the turn they extend, and touch no message of the history.
	before := tk.Stats()
	checkBlocks(t, tk, plain, chat(append(slices.Clone(msgs[:4]), msg("user", text("A fork.")))...))
	checkBlocks(t, tk, plain, chat(append(slices.Clone(msgs[:len(msgs)-1]), msg("user", text("An edit.")))...))
	after := tk.Stats()
	if after.Conversations.Hits != before.Conversations.Hits+2 || after.Messages != before.Messages {
		t.Errorf("fork and edit: conversation hits %d -> %d, message cache %+v -> %+v",
			before.Conversations.Hits, after.Conversations.Hits, before.Messages, after.Messages)
	}

	// A long document shared by different messages is tokenized once.
	doc := genDoc(9, 20000)
	tk.Key(nil, chat(msg("user", text(doc+"\nWhat is this?"))))
	chunks := tk.Stats().Chunks
	tk.Key(nil, chat(msg("user", text(doc+"\nSummarize it."))))
	if hits := tk.Stats().Chunks.Hits - chunks.Hits; hits < uint64(len(doc)/DefaultChunkBytes-1) {
		t.Errorf("shared document: %d chunk hits", hits)
	}
	// Repeated Encode hits the chunk cache.
	tk.Encode(nil, "short text")
	chunks = tk.Stats().Chunks
	tk.Encode(nil, "short text")
	if now := tk.Stats().Chunks; now.Hits != chunks.Hits+1 {
		t.Errorf("repeated Encode: chunk hits %d -> %d", chunks.Hits, now.Hits)
	}
	// Disabled caches report nothing.
	off := newTok(t, Options{CacheBytes: -1})
	off.Blocks(nil, chat(msgs...))
	if st := off.Stats(); st != (CacheStats{}) {
		t.Errorf("disabled caches: %+v", st)
	}
}

func TestCacheBoundWhenFlooded(t *testing.T) {
	const bound = 256 << 10
	tk := newTok(t, Options{CacheBytes: bound})
	doc := genDoc(11, 30000)
	for i := 0; i < 3000; i++ {
		s := fmt.Sprintf("%d %s", i, doc[(i*37)%20000:(i*37)%20000+1+i%5000])
		tk.Key(nil, chat(msg("user", text(s))))
		tk.Encode(nil, s)
		if i%100 == 0 {
			st := tk.Stats()
			if total := st.Messages.Bytes + st.Chunks.Bytes + st.Conversations.Bytes; total > st.Messages.MaxBytes || st.Messages.MaxBytes > bound {
				t.Fatalf("after %d texts: %d bytes held, bound %d: %+v", i, total, bound, st)
			}
		}
	}
	st := tk.Stats()
	if st.Messages.Entries == 0 || st.Chunks.Entries == 0 || st.Messages.Bytes+st.Chunks.Bytes < st.Messages.MaxBytes/2 {
		t.Errorf("flooded cache holds little: %+v", st)
	}
	// Tokens of entries are exact: compare to an uncached tokenizer.
	ref := newTok(t, Options{CacheBytes: -1})
	for i := 2990; i < 3000; i++ {
		s := fmt.Sprintf("%d %s", i, doc[(i*37)%20000:(i*37)%20000+1+i%5000])
		if !slices.Equal(tk.Encode(nil, s), ref.Encode(nil, s)) {
			t.Fatalf("cached tokens of text %d differ", i)
		}
	}
}

func TestLongText(t *testing.T) {
	doc := genDoc(12, 60<<10) + strings.Join(goDocs(t, 40<<10), "\n")
	doc = doc[:100<<10]
	for len(doc) > 0 && !utf8.ValidString(doc) {
		doc = doc[:len(doc)-1]
	}
	for _, enc := range encodings {
		tk := newTok(t, Options{Encoding: enc})
		toks := tk.Encode(nil, doc)
		if len(toks) < len(doc)/8 {
			t.Fatalf("%s: %d tokens for %d bytes", enc, len(toks), len(doc))
		}
		if got := decode(tk.v, toks); got != doc {
			t.Fatalf("%s: tokens do not decode to the text", enc)
		}
		key := tk.Key(nil, chat(msg("user", text(doc))))
		if !slices.Equal(key[1:len(key)-1], toks) {
			t.Fatalf("%s: message key is not role + Encode + end", enc)
		}
		// A 100 KB single word (no pre-tokenizer cuts) works too.
		word := strings.Repeat("abcdefghij", 10<<10)
		if got := decode(tk.v, tk.Encode(nil, word)); got != word {
			t.Fatalf("%s: long word does not round-trip", enc)
		}
	}
}

func TestInvalidUTF8(t *testing.T) {
	tk := newTok(t, Options{ChunkBytes: 64})
	s := strings.Repeat("ab\xffcd \xe6\x97 日本\xed\xa0\x80 ", 40)
	got := tk.Encode(nil, s)
	if want := tk.Encode(nil, validText(s)); !slices.Equal(got, want) {
		t.Fatal("invalid UTF-8 is not encoded as its U+FFFD form")
	}
	if decode(tk.v, got) != validText(s) {
		t.Fatal("invalid UTF-8 does not round-trip to its U+FFFD form")
	}
}

func TestConcurrentKeys(t *testing.T) {
	tk := newTok(t, Options{CacheBytes: 64 << 10, ChunkBytes: 256})
	plain := newTok(t, Options{CacheBytes: -1, ChunkBytes: 256})
	msgs := conversation(10)
	want := make([][]uint32, len(msgs))
	wantBlocks := make([][]uint32, len(msgs))
	for n := range msgs {
		want[n] = plain.Key(nil, chat(msgs[:n+1]...))
		wantBlocks[n] = refBlocks("", want[n], DefaultKeyBlock)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var dst []uint32
			for i := 0; i < 30; i++ {
				n := (i*7 + g) % len(msgs)
				dst = tk.Key(dst, chat(msgs[:n+1]...))
				if !slices.Equal(dst, want[n]) {
					t.Errorf("goroutine %d: key of %d messages differs", g, n+1)
					return
				}
				dst, _ = tk.Blocks(dst, chat(msgs[:n+1]...))
				if !slices.Equal(dst, wantBlocks[n]) {
					t.Errorf("goroutine %d: block key of %d messages differs", g, n+1)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// parsedChat renders req as a chat request body (a non-text part as an
// image URL naming its hash) and parses it back.
func parsedChat(tb testing.TB, req *oai.Request) *oai.Request {
	type part struct {
		Type     string            `json:"type"`
		Text     string            `json:"text,omitempty"`
		ImageURL map[string]string `json:"image_url,omitempty"`
	}
	type message struct {
		Role    string `json:"role"`
		Content []part `json:"content"`
	}
	var body struct {
		Model    string          `json:"model"`
		Tools    json.RawMessage `json:"tools,omitempty"`
		Messages []message       `json:"messages"`
	}
	body.Model = "m"
	if req.Tools != "" {
		body.Tools = json.RawMessage(req.Tools)
	}
	for _, m := range req.Messages {
		out := message{Role: m.Role}
		for _, p := range m.Parts {
			if p.IsText {
				out.Content = append(out.Content, part{Type: "text", Text: p.Text})
			} else {
				out.Content = append(out.Content, part{Type: "image_url", ImageURL: map[string]string{"url": fmt.Sprintf("img-%x", p.Hash)}})
			}
		}
		body.Messages = append(body.Messages, out)
	}
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	parsed, err := oai.Parse(oai.KindChat, b)
	if err != nil {
		tb.Fatal(err)
	}
	return parsed
}

// TestConversationBranches replays conversations that grow, repeat a turn,
// branch from an earlier turn and restart, from several goroutines that
// share some of them, built in code or parsed from bodies, and checks every
// key against an uncached tokenizer.
// Under the race detector it also checks that extending a conversation
// entry in place never races with readers copying it.
func TestConversationBranches(t *testing.T) {
	tk := newTok(t, Options{CacheBytes: 1 << 20, ChunkBytes: 256})
	plain := newTok(t, Options{CacheBytes: -1, ChunkBytes: 256})
	base := conversation(12)
	tools := `[{"type":"function","function":{"name":"lookup"}}]`
	var wg sync.WaitGroup
	for g := 0; g < 6; g++ {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			var dst []uint32
			cur := []oai.Message{base[0]}
			withTools := g%2 == 0
			for step := 0; step < 120; step++ {
				switch r := rng.IntN(10); {
				case r < 6 && len(cur) < len(base): // the next turn
					cur = append(cur, base[len(cur)])
				case r < 7: // a retry of the same request
				case r < 9 && len(cur) > 2: // a branch: an edited earlier message
					cut := 1 + rng.IntN(len(cur)-1)
					cur = append(cur[:cut:cut], msg("user", text(fmt.Sprintf("edited by %d at %d", g%3, step%5))))
				default: // a new conversation
					cur = []oai.Message{base[0]}
				}
				req := chat(cur...)
				if withTools {
					req.Tools = tools
				}
				if g%3 == 1 {
					// As the proxy sees it: parsed from a body, so each
					// message carries its JSON (Raw).
					req = parsedChat(t, req)
				}
				var tokens int
				dst, tokens = tk.Blocks(dst, req)
				want := plain.Key(nil, req)
				if !slices.Equal(dst, refBlocks(req.Model, want, DefaultKeyBlock)) || tokens != len(want) {
					t.Errorf("goroutine %d step %d: block key of %d messages differs from the uncached one", g, step, len(cur))
					return
				}
			}
		})
	}
	wg.Wait()
	if c := tk.Stats().Conversations; c.Hits == 0 || c.Bytes > c.MaxBytes {
		t.Errorf("conversation cache %+v", c)
	}
}

// A conversation of hundreds of short turns, each going on from the last
// one's tail (the tokens after its last whole block), keeps its keys exact.
func TestLongConversation(t *testing.T) {
	tk := newTok(t, Options{})
	plain := newTok(t, Options{CacheBytes: -1})
	msgs := []oai.Message{msg("system", text("You are a coding agent."))}
	for turn := 0; turn < 200; turn++ {
		msgs = append(msgs, msg("tool", text(fmt.Sprintf("result %d: 42 lines", turn))))
		checkBlocks(t, tk, plain, chat(msgs...))
	}
	if c := tk.Stats().Conversations; c.Entries != len(msgs)-1 || c.Hits != uint64(len(msgs)-2) {
		t.Errorf("conversation cache %+v, want %d entries and %d hits", c, len(msgs)-1, len(msgs)-2)
	}
}

func TestKeyWarmAllocs(t *testing.T) {
	tk := newTok(t, Options{})
	req := chat(conversation(10)...)
	req.Tools = `[{"type":"function"}]`
	dst := tk.Key(nil, req)
	allocs := testing.AllocsPerRun(100, func() { dst = tk.Key(dst, req) })
	if allocs != 0 {
		t.Errorf("warm Key allocates %.1f times", allocs)
	}
	if race.Enabled {
		return // the merge scratch and token buffers come from sync.Pools
	}
	// A repeated conversation is one copy of its blocks.
	dst, _ = tk.Blocks(dst, req)
	allocs = testing.AllocsPerRun(100, func() { dst, _ = tk.Blocks(dst, req) })
	if allocs != 0 {
		t.Errorf("warm Blocks allocates %.1f times", allocs)
	}
	plain := newTok(t, Options{CacheBytes: -1})
	dst = plain.Key(dst, req)
	allocs = testing.AllocsPerRun(20, func() { dst = plain.Key(dst, req) })
	if allocs > 1 {
		t.Errorf("uncached Key allocates %.1f times", allocs)
	}
}
