package load

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// The public traces are not part of the repository. The tests that read
// them run when MOONCAKE_TRACE / AZURE_CONV_TRACE name the downloaded files
// (MooncakeTraceURL, AzureConvTraceURL) or the traces sit beside the
// checkout (kvtest.Trace), and are skipped otherwise.
var (
	mooncakePath = kvtest.Trace("MOONCAKE_TRACE", "mooncake-fast25/conversation_trace.jsonl")
	azureConv    = kvtest.Trace("AZURE_CONV_TRACE", "azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
)

func needFile(t *testing.T, path string) {
	t.Helper()
	if path == "" {
		t.Skip("trace not given (set MOONCAKE_TRACE / AZURE_CONV_TRACE to the downloaded file)")
	}
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s not available: %v", path, err)
	}
}

func TestVocab(t *testing.T) {
	seen := make(map[string]bool)
	for _, w := range vocab {
		if len(w) != BytesPerToken || w[0] != ' ' || seen[w] {
			t.Errorf("bad vocabulary word %q", w)
		}
		seen[w] = true
	}
	a, b := synthText(42, 100), synthText(42, 60)
	if len(a) != 400 || !strings.HasPrefix(a, b) {
		t.Fatalf("synth stream not a prefix: %d %q", len(a), b)
	}
	if synthText(43, 100) == a {
		t.Fatal("different seeds, same text")
	}
	if got := MooncakeBlockText(5); len(got) != MooncakeBlockBytes || got != MooncakeBlockText(5) {
		t.Fatalf("block text: len %d", len(got))
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", "q\"b\\s/", "\n\r\t\x00\x1f\x7f", "héllo €", "\u2028\u2029", "bad\xffutf8", "<a&b>"} {
		var got string
		raw := appendJSONString(nil, s)
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatalf("%q: %s: %v", s, raw, err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		if got != want {
			t.Errorf("%q: round trip %q", s, got)
		}
	}
}

func TestMooncakeTrace(t *testing.T) {
	needFile(t, mooncakePath)
	w, err := Mooncake(mooncakePath, MooncakeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 12031 || w.HasSessions {
		t.Fatalf("%d requests, sessions %v", len(w.Requests), w.HasSessions)
	}
	hr := IdealHitRate(w, 0)
	t.Logf("ideal token-weighted hit rate: %.4f", hr)
	if hr < 0.366 || hr > 0.3745 {
		t.Fatalf("ideal hit rate %.4f outside docs/benchmarks.md's 36.6–37.4 %%", hr)
	}
	var last time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.At < last || r.Session != "" || r.DependsOn != -1 || r.MaxTokens < 1 || r.Messages != nil {
			t.Fatalf("request %d: %+v", i, r)
		}
		last = r.At
	}
	if span := w.Requests[len(w.Requests)-1].At; span < 3500*time.Second || span > 3600*time.Second {
		t.Fatalf("span %v", span)
	}

	// Shared leading IDs give equal text, and the first differing ID
	// different text.
	a, b := &w.Requests[0], &w.Requests[1]
	found := false
	for j := 1; j < 200 && !found; j++ {
		for i := 0; i < j; i++ {
			x, y := &w.Requests[i], &w.Requests[j]
			k := 0
			for k < len(x.Blocks) && k < len(y.Blocks) && x.Blocks[k] == y.Blocks[k] {
				k++
			}
			if k >= 2 && k < len(x.Blocks) && k < len(y.Blocks) {
				a, b, found = x, y, true
				break
			}
		}
	}
	if !found {
		t.Fatal("no pair sharing two leading blocks among the first 200 requests")
	}
	k := 0
	for a.Blocks[k] == b.Blocks[k] {
		k++
	}
	ta, tb := a.Chat()[0].Content, b.Chat()[0].Content
	n := k * MooncakeBlockBytes
	if ta[:n] != tb[:n] {
		t.Fatal("shared hash IDs, different text")
	}
	if len(ta) > n && len(tb) > n {
		end := min(len(ta), len(tb), n+MooncakeBlockBytes)
		if ta[n:end] == tb[n:end] {
			t.Fatal("different hash IDs, same text")
		}
	}
	// Every block's text is its ID's text; the total matches input_length.
	for _, r := range w.Requests[:300] {
		msgs := r.Chat()
		if len(msgs) != 1 || msgs[0].Role != "user" {
			t.Fatalf("messages %v", len(msgs))
		}
		text := msgs[0].Content
		if len(text) != r.PromptTokens*BytesPerToken {
			t.Fatalf("text %d bytes for %d tokens", len(text), r.PromptTokens)
		}
		for j, id := range r.Blocks {
			blk := MooncakeBlockText(id)
			seg := text[j*MooncakeBlockBytes : min(len(text), (j+1)*MooncakeBlockBytes)]
			if !strings.HasPrefix(blk, seg) {
				t.Fatalf("block %d of request: text differs from its ID's", j)
			}
		}
	}
	// Block IDs distinct from a different ID's text.
	if MooncakeBlockText(0) == MooncakeBlockText(1) {
		t.Fatal("IDs 0 and 1 share text")
	}
	// The body sent is valid JSON carrying the same text.
	r := &w.Requests[3]
	var body struct {
		Model     string    `json:"model"`
		Messages  []Message `json:"messages"`
		MaxTokens int       `json:"max_tokens"`
		IgnoreEOS bool      `json:"ignore_eos"`
		Stream    bool      `json:"stream"`
		Opts      struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(appendBody(nil, "m", r), &body); err != nil {
		t.Fatal(err)
	}
	if body.Model != "m" || !reflect.DeepEqual(body.Messages, r.Chat()) || body.MaxTokens != r.MaxTokens ||
		!body.IgnoreEOS || !body.Stream || !body.Opts.IncludeUsage {
		t.Fatalf("body mismatch: %+v", body.MaxTokens)
	}
}

func TestMooncakeOptions(t *testing.T) {
	needFile(t, mooncakePath)
	full, err := Mooncake(mooncakePath, MooncakeOptions{Limit: 2000})
	if err != nil {
		t.Fatal(err)
	}
	w, err := Mooncake(mooncakePath, MooncakeOptions{TimeScale: 0.5, RateScale: 2, Limit: 100, MaxTokensCap: 64, StartAt: 60 * time.Second, Materialize: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 100 {
		t.Fatalf("%d requests", len(w.Requests))
	}
	skip := 0
	for full.Requests[skip].At < 60*time.Second {
		skip++
	}
	for i, r := range w.Requests {
		o := full.Requests[skip+i]
		want := (o.At - 60*time.Second) / 4
		if d := r.At - want; d < -time.Microsecond || d > time.Microsecond {
			t.Fatalf("request %d at %v, want %v", i, r.At, want)
		}
		if r.MaxTokens != min(o.MaxTokens, 64) || r.Messages == nil || r.Messages[0].Content != o.Chat()[0].Content {
			t.Fatalf("request %d differs from the trace", i)
		}
	}
}

func TestMultiTurn(t *testing.T) {
	opt := MultiTurnOptions{Users: 6, SystemPrompts: 2, SystemTokens: 300, Turns: 4, Think: 2 * time.Second,
		UserTokens: 40, AnswerTokens: 50, Duration: 10 * time.Second, Seed: 7}
	w := MultiTurn(opt)
	if !reflect.DeepEqual(w, MultiTurn(opt)) {
		t.Fatal("not deterministic")
	}
	if len(w.Requests) != 24 || !w.HasSessions {
		t.Fatalf("%d requests", len(w.Requests))
	}
	last := make(map[string]int)
	var prevAt time.Duration
	for i := range w.Requests {
		r := &w.Requests[i]
		if r.At < prevAt {
			t.Fatal("not in arrival order")
		}
		prevAt = r.At
		if !strings.HasPrefix(r.Session, "user-") || r.MaxTokens != 50 {
			t.Fatalf("request %d: session %q", i, r.Session)
		}
		p, ok := last[r.Session]
		last[r.Session] = i
		if !ok {
			if r.DependsOn != -1 || len(r.Messages) != 2 || r.Messages[0].Role != "system" || r.At >= opt.Duration {
				t.Fatalf("first turn %d: %+v", i, r.DependsOn)
			}
			continue
		}
		q := &w.Requests[p]
		if r.DependsOn != p || r.Think != opt.Think || r.At != q.At+opt.Think {
			t.Fatalf("request %d depends on %d (think %v), want %d", i, r.DependsOn, r.Think, p)
		}
		if len(r.Messages) != len(q.Messages)+2 || !reflect.DeepEqual(r.Messages[:len(q.Messages)], q.Messages) {
			t.Fatalf("turn %d does not extend turn %d", i, p)
		}
		if a := r.Messages[len(q.Messages)]; a.Role != "assistant" || len(a.Content) != 50*BytesPerToken {
			t.Fatalf("answer %+v", a.Role)
		}
		if r.PromptTokens <= q.PromptTokens+90 {
			t.Fatalf("prompt did not grow: %d -> %d", q.PromptTokens, r.PromptTokens)
		}
		if !strings.HasPrefix(renderChat(r.Messages), renderChat(q.Messages)) {
			t.Fatal("rendered prompt not a prefix extension")
		}
	}
	// Users 0 and 2 share system prompt 0; 0 and 1 do not.
	sys := make(map[string]string)
	for _, r := range w.Requests {
		sys[r.Session] = r.Messages[0].Content
	}
	if sys["user-0"] != sys["user-2"] || sys["user-0"] == sys["user-1"] {
		t.Fatal("system prompts not shared round-robin")
	}
	if hr := IdealHitRate(w, 16); hr < 0.5 || hr > 1 {
		t.Fatalf("ideal hit rate %.3f", hr)
	}
}

func TestHotPrefix(t *testing.T) {
	opt := HotPrefixOptions{N: 400, Rate: 50, Share: 0.25, PrefixTokens: 1000, SuffixTokens: 100, Seed: 3}
	w := HotPrefix(opt)
	if !reflect.DeepEqual(w, HotPrefix(opt)) {
		t.Fatal("not deterministic")
	}
	count := make(map[string]int)
	suffixes := make(map[string]bool)
	for _, r := range w.Requests {
		count[r.Messages[0].Content]++
		suffixes[r.Messages[1].Content] = true
		if len(r.Messages[0].Content) != 4000 || len(r.Messages[1].Content) != 400 {
			t.Fatal("lengths")
		}
	}
	hot := 0
	for _, c := range count {
		if c > 1 {
			if hot != 0 {
				t.Fatal("two shared prefixes")
			}
			hot = c
		}
	}
	if hot != 100 || len(count) != 301 || len(suffixes) != 400 {
		t.Fatalf("hot %d, distinct prefixes %d, suffixes %d", hot, len(count), len(suffixes))
	}
	// Poisson at 50 req/s: 400 arrivals in about 8 s.
	if span := w.Requests[399].At; span < 6*time.Second || span > 10*time.Second {
		t.Fatalf("span %v", span)
	}
	// Ideal: the 99 later hot requests hit (almost) their whole prefix.
	hr := IdealHitRate(w, 16)
	want := 99 * 1000.0 / (400 * 1105.0)
	if hr < want*0.95 || hr > want*1.02 {
		t.Fatalf("ideal hit rate %.4f, want about %.4f", hr, want)
	}
}

func TestNoReuse(t *testing.T) {
	w, err := NoReuse(NoReuseOptions{N: 300, Rate: 20, PromptTokens: 200, MaxTokens: 16, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	checkNoReuse(t, w)
	for _, r := range w.Requests {
		if r.MaxTokens != 16 || len(r.Messages[0].Content) != 800 {
			t.Fatal("lengths")
		}
	}
}

func checkNoReuse(t *testing.T, w *Workload) {
	t.Helper()
	first := make(map[uint64]bool)
	for _, r := range w.Requests {
		keys := chainKeys(nil, renderChat(r.Messages), 64)
		if len(keys) == 0 {
			continue
		}
		if first[keys[0]] {
			t.Fatal("shared leading block")
		}
		first[keys[0]] = true
	}
	if hr := IdealHitRate(w, 16); hr != 0 {
		t.Fatalf("ideal hit rate %v", hr)
	}
}

func TestNoReuseAzure(t *testing.T) {
	needFile(t, azureConv)
	w, err := NoReuse(NoReuseOptions{N: 500, Rate: 10, AzurePath: azureConv, MaxTokensCap: 300, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkNoReuse(t, w)
	var sum int
	for _, r := range w.Requests {
		sum += r.PromptTokens
		if r.MaxTokens < 1 || r.MaxTokens > 300 {
			t.Fatal("max tokens")
		}
	}
	// conv mean input is 1,155 tokens.
	if mean := sum / 500; mean < 900 || mean > 1400 {
		t.Fatalf("mean prompt %d", mean)
	}
	tr, err := NoReuse(NoReuseOptions{N: 100, AzurePath: azureConv, TraceArrivals: true, TimeScale: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	// First rows: 18:15:46.68059, then 18:15:50.995169, halved.
	if tr.Requests[0].At != 0 || tr.Requests[1].At != 2157289500*time.Nanosecond || tr.Requests[0].PromptTokens != 374+3 {
		t.Fatalf("trace arrivals: %v %v %d", tr.Requests[0].At, tr.Requests[1].At, tr.Requests[0].PromptTokens)
	}
}
