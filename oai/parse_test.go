package oai

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestParseChat(t *testing.T) {
	body := `{"model":"llama","stream":true,"user":"u1","tools":[{"type":"function","function":{"name":"f"}}],
	"messages":[{"role":"system","content":"be brief"},
	{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:a"}}]},
	{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}]}`
	req, err := Parse(KindChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "llama" || !req.Stream || req.User != "u1" {
		t.Errorf("common fields: %+v", req)
	}
	if !strings.Contains(req.Tools, `"name":"f"`) {
		t.Errorf("tools %q", req.Tools)
	}
	if len(req.Messages) != 3 {
		t.Fatalf("messages %d", len(req.Messages))
	}
	if m := req.Messages[0]; m.Role != "system" || len(m.Parts) != 1 || m.Parts[0].Text != "be brief" {
		t.Errorf("system message %+v", m)
	}
	user := req.Messages[1]
	if len(user.Parts) != 2 || !user.Parts[0].IsText || user.Parts[1].IsText || user.Parts[1].Hash == 0 {
		t.Errorf("user parts %+v", user.Parts)
	}
	if a := req.Messages[2]; len(a.Parts) != 1 || !strings.Contains(a.Parts[0].Text, "c1") {
		t.Errorf("tool calls not folded in: %+v", a)
	}
}

func TestImagesHashDiffer(t *testing.T) {
	mk := func(url string) uint64 {
		req, err := Parse(KindChat, []byte(`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"`+url+`"}}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		return req.Messages[0].Parts[0].Hash
	}
	one := mk("data:one")
	if one == mk("data:two") {
		t.Error("different images hash equal")
	}
	if one != mk("data:one") { // the same image, parsed again
		t.Error("equal images hash differently")
	}
}

func TestParsePrompts(t *testing.T) {
	cases := []struct {
		name   string
		kind   Kind
		body   string
		texts  int
		tokens int
	}{
		{"string", KindCompletion, `{"prompt":"hi"}`, 1, 0},
		{"strings", KindCompletion, `{"prompt":["a","b"]}`, 2, 0},
		{"tokens", KindCompletion, `{"prompt":[1,2,3]}`, 0, 1},
		{"token lists", KindCompletion, `{"prompt":[[1],[2,3]]}`, 0, 2},
		{"embedding", KindEmbedding, `{"input":"x"}`, 1, 0},
		{"generate text", KindGenerate, `{"text":"x"}`, 1, 0},
		{"generate ids", KindGenerate, `{"input_ids":[5,6]}`, 0, 1},
		{"responses string", KindResponses, `{"input":"x","instructions":"sys"}`, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := Parse(c.kind, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if len(req.Prompt.Texts) != c.texts || len(req.Prompt.Tokens) != c.tokens {
				t.Errorf("prompt %+v", req.Prompt)
			}
		})
	}
	req, _ := Parse(KindResponses, []byte(`{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]}],"instructions":"sys"}`))
	if len(req.Messages) != 2 || req.Messages[0].Role != "system" || req.Messages[1].Parts[0].Text != "q" {
		t.Errorf("responses messages %+v", req.Messages)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, body string
		kind       Kind
		param      string
	}{
		{"empty", ``, KindChat, ""},
		{"garbage", `nope`, KindChat, ""},
		{"array", `[]`, KindChat, ""},
		{"no messages", `{}`, KindChat, "messages"},
		{"empty messages", `{"messages":[]}`, KindChat, "messages"},
		{"message not object", `{"messages":[1]}`, KindChat, "messages"},
		{"role number", `{"messages":[{"role":1}]}`, KindChat, "messages"},
		{"content object", `{"messages":[{"role":"user","content":{}}]}`, KindChat, "messages"},
		{"text part number", `{"messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, KindChat, "messages"},
		{"tools object", `{"tools":{},"messages":[{"role":"user","content":"x"}]}`, KindChat, "tools"},
		{"user number", `{"user":1,"prompt":"x"}`, KindCompletion, "user"},
		{"negative token", `{"prompt":[-1]}`, KindCompletion, "prompt"},
		{"huge token", `{"prompt":[99999999999]}`, KindCompletion, "prompt"},
		{"empty prompt list", `{"prompt":[]}`, KindCompletion, "prompt"},
		{"no input", `{}`, KindResponses, "input"},
		{"generate nothing", `{}`, KindGenerate, "text"},
		{"deep nesting", strings.Repeat("[", 5000) + strings.Repeat("]", 5000), KindChat, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.kind, []byte(c.body))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v, want *Error", err)
			}
			if e.Status != 400 || e.Param != c.param {
				t.Errorf("status %d param %q, want 400 %q (%s)", e.Status, e.Param, c.param, e.Message)
			}
			if !strings.Contains(string(e.Body()), `"error":{"message":`) {
				t.Errorf("body %s", e.Body())
			}
		})
	}
}

// TestRequestAliasesBody pins the copy rule documented on Request. It
// replaces TestRequestDoesNotAliasBody: Parse used to copy every string out of
// the body; now, to keep the routing path from copying the prompt, strings
// without escapes (and already compact JSON) alias the body and change with
// it, while strings Parse had to build (unescaped, compacted, name parts)
// are its own. Callers copy what they keep beyond the body's life
// (router.Sessions.Bind clones the session it stores).
func TestRequestAliasesBody(t *testing.T) {
	body := []byte(`{"model":"mmmm","user":"uu","tools":[{"a":1}],"messages":[{"role":"user","name":"nn","content":"original"},` +
		`{"role":"assistant","content":"esc\"aped","tool_calls":[ {"id":"c"} ]}]}`)
	req, err := Parse(KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	m0, m1 := req.Messages[0], req.Messages[1]
	owned := map[string]string{
		"name part":      m0.Parts[0].Text,
		"escaped text":   m1.Parts[0].Text,
		"compacted fold": m1.Parts[1].Text,
	}
	wantOwned := map[string]string{"name part": "name:nn", "escaped text": `esc"aped`, "compacted fold": `[{"id":"c"}]`}
	for i := range body {
		body[i] = 'x'
	}
	for field, got := range map[string]string{"model": req.Model, "user": req.User, "tools": req.Tools,
		"role": m0.Role, "text": m0.Parts[1].Text} {
		if strings.Trim(got, "x") != "" {
			t.Errorf("%s = %q does not alias the body", field, got)
		}
	}
	for k, got := range owned {
		if got != wantOwned[k] {
			t.Errorf("%s = %q, want %q (not aliasing the body)", k, got, wantOwned[k])
		}
	}
}

func FuzzParse(f *testing.F) {
	seeds := []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[]}`,
		`{"prompt":[[1,2],[3]]}`, `{"prompt":["a","b"],"stream":true,"user":"u"}`,
		`{"input":[{"role":"user","content":"x"},{"type":"function_call_output","output":"y"}]}`,
		`{"text":"a"}`, `{"input_ids":[1]}`, `[]`, `{`, "\xff",
		`{"model":"m","previous_response_id":"resp_1","input":"x"}`, `{"response":{"id":"resp_2"},"type":"response.created"}`,
	}
	for _, s := range seeds {
		for k := KindChat; k <= KindGenerate; k++ {
			f.Add(uint8(k), []byte(s))
		}
	}
	// One Buffers across all inputs, so each parse reuses memory an
	// earlier, different body left behind.
	var bufs Buffers
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		k := Kind(kind%5 + 1)
		req, err := Parse(k, body)
		reused, rerr := bufs.Parse(k, body)
		if fmt.Sprint(err) != fmt.Sprint(rerr) || !reflect.DeepEqual(req, reused) {
			t.Fatalf("with reused buffers: %+v, %v; fresh: %+v, %v", reused, rerr, req, err)
		}
		_, _ = LookupString(body, "response", "id") // any bytes: no panic
		if err == nil {
			// LookupString reads a top-level string as Parse does.
			if m, _ := LookupString(body, "model"); m != req.Model {
				t.Fatalf("LookupString model %q, Parse %q", m, req.Model)
			}
			if id, _ := LookupString(body, "previous_response_id"); k == KindResponses && id != req.PreviousResponseID {
				t.Fatalf("LookupString previous_response_id %q, Parse %q", id, req.PreviousResponseID)
			}
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Status != 400 || e.Message == "" {
				t.Fatalf("error %v is not a 400 *Error", err)
			}
			return
		}
		if req.Kind != k {
			t.Fatalf("kind %v, want %v", req.Kind, k)
		}
		if k == KindChat && len(req.Messages) == 0 {
			t.Fatal("chat request without messages accepted")
		}
	})
}
