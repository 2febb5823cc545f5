package oai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/valyala/fastjson"
)

// The differential fuzzer checks Parse against refParse (the fastjson-based
// parser it replaced, kept in reference_test.go) and against encoding/json.
//
// Documented differences, each handled explicitly below:
//
//  1. Validation. Parse accepts exactly RFC 8259 JSON (encoding/json.Valid)
//     in valid UTF-8, nested at most maxDepth levels. fastjson accepted
//     more: numbers like 01, 1., +1, .5, -, inf, nan; unknown escapes like
//     \x; raw control characters in strings. Such bodies are now a 400.
//     The depth limit is fastjson's (same count, same 300), so deep bodies
//     are decided as before.
//  2. Escape spelling. fastjson looked keys up raw first and unescaped them
//     only on a miss, so which of two spellings of a key ("model" and
//     "mod\u0065l") it read depended on the lookups before; it kept unpaired
//     surrogate escapes as literal text, or swallowed the escape after one.
//     Parse compares keys unescaped (the first occurrence wins) and decodes
//     an unpaired surrogate to U+FFFD as encoding/json does. The fuzzer
//     therefore compares Parse(body) with refParse(canon(body)), where canon
//     re-encodes the body through encoding/json with minimal escapes: same
//     structure, same order, same duplicates, one spelling. refParse(body)
//     may decide differently only when body has a backslash.
//  3. Folded JSON (Tools, tool calls, responses items) is the body's text
//     without the whitespace outside strings; fastjson re-rendered some
//     strings (sometimes with Go quoting). Folded texts are compared as
//     token streams with every string decoded.
//  4. Part hashes hash the compact text, escapes as written, so two parts
//     equal for fastjson may hash differently when spelled differently:
//     within one input, parts equal for Parse must be equal for refParse,
//     and parts equal for refParse but not for Parse need a backslash.
func FuzzParseMatchesReference(f *testing.F) {
	for _, s := range fuzzSeeds {
		for k := KindOther; k <= KindGenerate; k++ {
			f.Add(uint8(k), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		checkAgainstReference(t, Kind(kind%6), body)
	})
}

var fuzzSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[]}`,
	`{"prompt":[[1,2],[3]]}`, `{"prompt":["a","b"],"stream":true,"user":"u"}`,
	`{"model":"m","priority":-2,"messages":[]}`, `{"prompt":"p","priority":1.5,"priority":3}`,
	`{"input":[{"role":"user","content":"x"},{"type":"function_call_output","output":"y"}]}`,
	`{"text":"a"}`, `{"input_ids":[1]}`, `[]`, `{`, "\xff",
	`{"model" : "llama", "stream" : false, "tools" : [ {"type": "function", "function": {"name": "f", "parameters": {"a b": [1, 2.5e3, true, null]}}} ],
	  "messages" : [ {"role": "system", "content": "be\nbrief \"now\" \u00e9\ud83d\ude00"},
	  {"role": "user", "name": "al\u0069ce", "content": [ {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:a"}}, {"type": "image_url", "image_url":{"url":"data:a"}}, "bare" ]},
	  {"role": "assistant", "content": null, "tool_calls": [ {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}} ], "function_call": {"name":"g"}},
	  {"role": "tool", "tool_call_id": "c1", "content": "42"} ]}`,
	`{"mod\u0065l":1,"model":"x","messages":[{"role":"user","content":"a"}]}`,
	`{"model":"a","model":1,"stream":"no","stream":true,"prompt":"p"}`,
	`{"messages":[{"content":{},"role":1}]}`, `{"messages":[{"role":"u","content":[1,{"type":"text","text":2}]}]}`,
	`{"messages":[{"role":"u","content":"\ud800 \udc00\u0041 \ud800\u0041 \udbff\udfff"}]}`,
	`{"prompt":[0,4294967295]}`, `{"prompt":[4294967296]}`, `{"prompt":[1.0]}`, `{"prompt":[-0]}`, `{"prompt":[1e2]}`,
	`{"prompt":[[],[1]]}`, `{"prompt":[[1],"a"]}`, `{"prompt":["a",1]}`, `{"prompt":[true]}`, `{"prompt":{}}`,
	`{"prompt":01}`, `{"prompt":"\x"}`, "{\"prompt\":\"a\x01\"}", `{"prompt":nan}`, `{"prompt":[+1]}`, `{"prompt":[1.]}`,
	`{"text":null,"input_ids":[1,2]}`, `{"text":[1,2],"input_ids":"x"}`, `{"input_ids":null}`,
	`{"input":null,"previous_response_id":null}`, `{"previous_response_id":"resp_1"}`, `{"previous_response_id":"r\u0031","input":"x","previous_response_id":2}`,
	`{"previous_response_id":1,"input":"x"}`, `{"input":[{"role":"user","content":[{"type":"input_text","text":"q"}]},{"type":"reasoning", "summary": [ ]}],"instructions":"sys","tools":{}}`,
	`{"input":[1]}`, `{"input":[{"content":{}}]}`, `{"instructions":1,"input":5}`,
	`{"messages":[{"role":"u","content":[{"type":"image","text":5}]}]}`, `{"messages":[{"role":"u","content":[{"type":"","text":"t"},{"text":"t2","type":7}]}]}`,
	`{"messages":[{"role":"u","content":[{"type":"te\u0078t","text":"t"}]}]}`,
	`{"cache_salt":"s1","prompt":"p"}`, `{"cache_salt":1,"user":2,"prompt":"p"}`, `{"cache_s\u0061lt":"a","cache_salt":"b","messages":[{"role":"u"}]}`,
	`{"cache_salt":null,"input":"x"}`, `{"cache_salt":"","text":"a"}`, `{"cache_salt":"` + strings.Repeat("s", 257) + `","model":1}`,
	`{"cache_salt":"` + strings.Repeat("\u00e9", 128) + `","prompt":"p"}`, `{"cache_salt":"` + strings.Repeat("\u00e9", 129) + `","prompt":"p"}`,
	` {"messages":[{"role":"u"}]} `, `{"messages":[{"role":"u"}]} x`, `"str"`, `12`, `true`, `null`, `  `,
	strings.Repeat("[", 299) + strings.Repeat("]", 299), strings.Repeat("[", 300) + strings.Repeat("]", 300),
	strings.Repeat("[", 299) + "1" + strings.Repeat("]", 299), strings.Repeat("[", 300) + "1" + strings.Repeat("]", 300),
	`{"messages":[{"role":"u","content":"x","x":` + strings.Repeat(`{"a":`, 296) + `1` + strings.Repeat("}", 296) + `}]}`,
	`{"messages":[{"role":"u","content":"x","x":` + strings.Repeat(`{"a":`, 297) + `1` + strings.Repeat("}", 297) + `}]}`,
}

// checkAgainstReference runs one differential check.
func checkAgainstReference(t *testing.T, k Kind, body []byte) {
	t.Helper()
	got, err := Parse(k, body)
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Status != 400 || e.Message == "" {
			t.Fatalf("error %v is not a 400 *Error", err)
		}
	}
	valid := json.Valid(body) && utf8.Valid(body)
	var canon []byte
	depth := 0
	if valid {
		var cerr error
		if canon, depth, cerr = canonicalize(body); cerr != nil {
			t.Fatalf("canonicalize a valid body: %v", cerr)
		}
	}
	_, refErr := refParse(k, body)

	// 1. Validation: Parse rejects as invalid exactly the bodies that are not
	// RFC 8259 JSON in UTF-8 within the depth limit.
	wantSyntax := !valid || depth > maxDepth
	if gotSyntax := err != nil && isSyntaxError(err); gotSyntax != wantSyntax {
		t.Fatalf("syntax error %v, want one: %v (valid %v, depth %d)", err, wantSyntax, valid, depth)
	}
	if wantSyntax {
		if refErr == nil && valid {
			t.Fatalf("reference accepts a body of depth %d", depth)
		}
		return // the reference may accept an invalid body (difference 1)
	}
	if refErr != nil && isSyntaxError(refErr) {
		t.Fatalf("reference rejects valid JSON: %v", refErr)
	}

	// 2. Decisions, against the reference on the canonical body.
	cref, crefErr := refParse(k, canon)
	if (refErr == nil) != (crefErr == nil) && bytes.IndexByte(body, '\\') < 0 {
		t.Fatalf("reference decides differently on the canonical body without escapes: %v vs %v", refErr, crefErr)
	}
	if (err == nil) != (crefErr == nil) {
		t.Fatalf("accept/reject differ: got %v, reference %v\ncanonical %s", err, crefErr, canon)
	}
	if err != nil {
		var e, re *Error
		if !errors.As(err, &e) || !errors.As(crefErr, &re) {
			t.Fatalf("errors are not *Error: got %v, reference %v", err, crefErr)
		}
		if e.Message != re.Message || e.Param != re.Param {
			t.Fatalf("error %q (param %q), reference %q (param %q)", e.Message, e.Param, re.Message, re.Param)
		}
		return
	}
	if (err == nil) != (refErr == nil) && bytes.IndexByte(body, '\\') < 0 {
		t.Fatalf("accept/reject differ on the original body: got %v, reference %v", err, refErr)
	}
	compareRequests(t, cref, got, body)
	checkPrevious(t, got, canon)
}

// checkPrevious checks PreviousResponseID, which the reference does not
// read, against fastjson's first top-level "previous_response_id" of the
// canonical body: the string of a responses request, else empty.
func checkPrevious(t *testing.T, got *Request, canon []byte) {
	t.Helper()
	want := ""
	if got.Kind == KindResponses {
		if v, err := fastjson.ParseBytes(canon); err == nil {
			if pv := v.Get("previous_response_id"); pv != nil && pv.Type() == fastjson.TypeString {
				want = string(pv.GetStringBytes())
			}
		}
	}
	if got.PreviousResponseID != want {
		t.Fatalf("previous_response_id %q, reference %q", got.PreviousResponseID, want)
	}
}

// isSyntaxError tells the errors about the body as a whole (empty, not
// UTF-8, not JSON) from those about its fields.
func isSyntaxError(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Message == "request body is not valid UTF-8" ||
		strings.HasPrefix(e.Message, "request body is empty") ||
		strings.HasPrefix(e.Message, "request body is not valid JSON")
}

func compareRequests(t *testing.T, ref, got *Request, body []byte) {
	t.Helper()
	checkRaw(t, got, body)
	if got.Kind != ref.Kind || got.Model != ref.Model || got.Stream != ref.Stream || got.User != ref.User ||
		got.CacheSalt != ref.CacheSalt || got.Priority != ref.Priority || got.HasPriority != ref.HasPriority {
		t.Fatalf("common fields %+v, reference %+v", got, ref)
	}
	if !sameJSONText(ref.Tools, got.Tools) {
		t.Fatalf("tools %q, reference %q", got.Tools, ref.Tools)
	}
	if len(got.Messages) != len(ref.Messages) {
		t.Fatalf("%d messages, reference %d", len(got.Messages), len(ref.Messages))
	}
	var gotHashes, refHashes []uint64
	for i, m := range got.Messages {
		rm := ref.Messages[i]
		if m.Role != rm.Role || len(m.Parts) != len(rm.Parts) {
			t.Fatalf("message %d: %+v, reference %+v", i, m, rm)
		}
		for j, p := range m.Parts {
			rp := rm.Parts[j]
			if p.IsText != rp.IsText {
				t.Fatalf("message %d part %d: %+v, reference %+v", i, j, p, rp)
			}
			if !p.IsText {
				gotHashes, refHashes = append(gotHashes, p.Hash), append(refHashes, rp.Hash)
				continue
			}
			// Plain texts are equal; folded JSON (tool calls, items) may
			// differ in spelling only (difference 3).
			if p.Text != rp.Text && (!json.Valid([]byte(p.Text)) || !sameJSONText(rp.Text, p.Text)) {
				t.Fatalf("message %d part %d: text %q, reference %q", i, j, p.Text, rp.Text)
			}
		}
	}
	for i := range gotHashes {
		for j := i + 1; j < len(gotHashes); j++ {
			ge, re := gotHashes[i] == gotHashes[j], refHashes[i] == refHashes[j]
			if ge && !re {
				t.Fatalf("parts %d and %d hash equal, reference tells them apart", i, j)
			}
			if re && !ge && bytes.IndexByte(body, '\\') < 0 {
				t.Fatalf("parts %d and %d hash differently, reference equal, no escapes", i, j)
			}
		}
	}
	if !slicesEqual(got.Prompt.Texts, ref.Prompt.Texts) || len(got.Prompt.Tokens) != len(ref.Prompt.Tokens) {
		t.Fatalf("prompt %+v, reference %+v", got.Prompt, ref.Prompt)
	}
	for i := range got.Prompt.Tokens {
		if !slicesEqual(got.Prompt.Tokens[i], ref.Prompt.Tokens[i]) {
			t.Fatalf("prompt tokens %v, reference %v", got.Prompt.Tokens, ref.Prompt.Tokens)
		}
	}
}

// checkRaw checks that every message's Raw is its JSON as written in body
// and that it determines the message: read again from Raw alone, it has the
// same role and parts. Only a responses request's instructions have no Raw.
func checkRaw(t *testing.T, got *Request, body []byte) {
	t.Helper()
	for i, m := range got.Messages {
		if m.Raw == "" {
			if got.Kind != KindResponses || i != 0 || m.Role != "system" {
				t.Fatalf("message %d (%s) has no Raw", i, m.Role)
			}
			continue
		}
		if !bytes.Contains(body, []byte(m.Raw)) || !json.Valid([]byte(m.Raw)) {
			t.Fatalf("message %d: Raw %q is not a JSON value of the body", i, m.Raw)
		}
		var alone string
		switch {
		case got.Kind != KindResponses:
			alone = `{"messages":[` + m.Raw + `]}`
		case m.Raw[0] == '"':
			alone = `{"input":` + m.Raw + `}`
		default:
			alone = `{"input":[` + m.Raw + `]}`
		}
		again, err := Parse(got.Kind, []byte(alone))
		if err != nil || len(again.Messages) != 1 {
			t.Fatalf("message %d read from its Raw %q: %v", i, m.Raw, err)
		}
		if a := again.Messages[0]; a.Role != m.Role || !slicesEqual(a.Parts, m.Parts) {
			t.Fatalf("message %d read from its Raw: %+v, in the request %+v", i, a, m)
		}
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// canonicalize re-encodes a valid JSON body through encoding/json's token
// stream: no whitespace, strings decoded and re-quoted escaping only '"',
// '\' and control characters, numbers as written, members in order with
// duplicates. It also returns the nesting depth as fastjson counts it (the
// top-level value is at depth 1, scalars count).
func canonicalize(body []byte) ([]byte, int, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	type frame struct {
		obj bool
		n   int // tokens read in the container (keys and values)
	}
	var stack []frame
	var out []byte
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out, depth, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			out = append(out, byte(d))
			stack = stack[:len(stack)-1]
			continue
		}
		key := false
		if len(stack) > 0 {
			f := &stack[len(stack)-1]
			switch {
			case f.obj && f.n%2 == 1:
				out = append(out, ':')
			case f.n > 0:
				out = append(out, ',')
			}
			key = f.obj && f.n%2 == 0
			f.n++
		}
		if !key {
			depth = max(depth, len(stack)+1)
		}
		switch v := tok.(type) {
		case json.Delim:
			out = append(out, byte(v))
			stack = append(stack, frame{obj: v == '{'})
		case string:
			out = appendMinQuoted(out, v)
		case json.Number:
			out = append(out, v...)
		case bool:
			out = strconv.AppendBool(out, v)
		case nil:
			out = append(out, "null"...)
		}
	}
}

func appendMinQuoted(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, fmt.Sprintf(`\u%04x`, c)...)
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}

// sameJSONText reports whether a and b are the same JSON token stream, with
// strings compared decoded; a string that is not JSON may be Go-quoted (as
// fastjson re-rendered some).
func sameJSONText(a, b string) bool {
	ca, oka := jsonTokens(a)
	cb, okb := jsonTokens(b)
	return oka && okb && slicesEqual(ca, cb)
}

func jsonTokens(s string) ([]string, bool) {
	var toks []string
	for i := 0; i < len(s); {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '{', '}', '[', ']', ',', ':':
			toks = append(toks, string(c))
			i++
		case '"':
			j := i + 1
			for j < len(s) && s[j] != '"' {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, false
			}
			raw := s[i : j+1]
			var dec string
			if err := json.Unmarshal([]byte(raw), &dec); err != nil {
				var uerr error
				if dec, uerr = strconv.Unquote(raw); uerr != nil {
					return nil, false
				}
			}
			toks = append(toks, strconv.Quote(dec))
			i = j + 1
		default:
			j := i
			for j < len(s) && !strings.ContainsRune(" \t\n\r{}[],:\"", rune(s[j])) {
				j++
			}
			toks = append(toks, s[i:j])
			i = j
		}
	}
	return toks, true
}

// TestParseMatchesReferenceSeeds runs the differential check over the seeds
// for every kind, so a plain go test covers it.
func TestParseMatchesReferenceSeeds(t *testing.T) {
	for _, s := range append(fuzzSeeds, benchBody(2<<10, false).String(), benchBody(2<<10, true).String()) {
		for k := KindOther; k <= KindGenerate; k++ {
			checkAgainstReference(t, k, []byte(s))
		}
	}
}

// TestValidation compares Parse's notion of valid JSON with encoding/json's
// on bodies fastjson accepted but RFC 8259 does not (difference 1), and on
// the edges of valid JSON.
func TestValidation(t *testing.T) {
	for _, v := range []string{
		`0`, `-0`, `-0.0e+0`, `1E5`, `01`, `1.`, `.5`, `+1`, `-`, `1e`, `1e+`, `--1`, `inf`, `nan`, `-inf`, `NaN`,
		`"\x"`, `"\u12"`, `"\u12g4"`, "\"a\x01\"", "\"a\x7f\"", `"\ud800"`, `"\/\b\f\n\r\t\"\\"`, `tru`, `nul`, `falsey`,
		`[1,]`, `[,1]`, `{"a":1,}`, `{"a" 1}`, `{1:1}`, `{"a":1 "b":2}`, `[1 2]`, "[1]\x00", "\ufeff[]", "[1]\u00a0",
	} {
		body := []byte(`{"prompt":[` + v + `]}`)
		_, err := Parse(KindCompletion, body)
		if got, want := err != nil && isSyntaxError(err), !json.Valid(body); got != want {
			t.Errorf("%s: syntax error %v (%v), encoding/json invalid %v", v, got, err, want)
		}
	}
}

func TestDepthLimit(t *testing.T) {
	for _, c := range []struct {
		body string
		ok   bool
	}{
		{strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth), true},
		{strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1), false},
		{strings.Repeat("[", maxDepth-1) + "1" + strings.Repeat("]", maxDepth-1), true},
		{strings.Repeat("[", maxDepth) + "1" + strings.Repeat("]", maxDepth), false},
		{strings.Repeat(`{"a":`, maxDepth-1) + "{}" + strings.Repeat("}", maxDepth-1), true},
		{strings.Repeat(`{"a":`, maxDepth) + "{}" + strings.Repeat("}", maxDepth), false},
		{strings.Repeat("[", 1<<20), false},
	} {
		_, err := Parse(KindChat, []byte(c.body))
		if syn := err != nil && isSyntaxError(err); syn == c.ok {
			t.Errorf("depth body of %d bytes: %v", len(c.body), err)
		}
		_, refErr := refParse(KindChat, []byte(c.body))
		if syn := refErr != nil && isSyntaxError(refErr); syn == c.ok {
			t.Errorf("reference on depth body of %d bytes: %v", len(c.body), refErr)
		}
	}
}

func TestUnescape(t *testing.T) {
	for raw, want := range map[string]string{
		`a\nb`:                "a\nb",
		`\"\\\/\b\f\r\t`:      "\"\\/\b\f\r\t",
		`\u00e9\u20AC`:        "é€",
		`\ud83d\ude00`:        "😀",
		`\ud800`:              "\uFFFD",
		`\udc00x`:             "\uFFFDx",
		`\ud800\u0041`:        "\uFFFDA",
		`\ud800\ud800\udc00`:  "\uFFFD𐀀",
		`\u0000`:              "\x00",
		`plain`:               "plain",
		`\u00e9` + "é" + `\n`: "éé\n",
	} {
		var std string
		if err := json.Unmarshal([]byte(`"`+raw+`"`), &std); err != nil || std != want {
			t.Fatalf("bad case %s: encoding/json gives %q", raw, std)
		}
		body := []byte(`{"prompt":"` + raw + `"}`)
		req, err := Parse(KindCompletion, body)
		if err != nil || req.Prompt.Texts[0] != want {
			t.Errorf("%s: %q, %v; want %q", raw, req.Prompt.Texts, err, want)
		}
	}
}

// benchBody is a chat body of about size bytes: a system prompt, tools, then
// user/assistant turns of about 1 KB. With escapes, texts have line breaks
// and quotes (as real prompts do), so they are decoded, not aliased.
func benchBody(size int, escapes bool) *bytes.Buffer {
	word := "the cache keeps shared prefixes warm across turns. "
	if escapes {
		word = "the \"cache\" keeps\nshared prefixes warm.\n "
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", strings.Repeat("You are a careful assistant. ", 20)}}
	n := 0
	for i := 0; n < size-600; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		text := fmt.Sprintf("turn %d: %s", i, strings.Repeat(word, 1000/len(word)))
		msgs = append(msgs, msg{role, text})
		n += len(text) + 40
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]any{
		"model": "llama", "stream": true, "messages": msgs,
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "parameters": map[string]any{"type": "object"}}}},
	})
	return &b
}

// BenchmarkParse compares Parse (new) with the fastjson-based reference
// (old) on chat bodies of 2 KB, 32 KB and 1 MB, with texts that alias the
// body (plain) or need decoding (escaped).
func BenchmarkParse(b *testing.B) {
	for _, size := range []int{2 << 10, 32 << 10, 1 << 20} {
		for _, escapes := range []bool{false, true} {
			body := benchBody(size, escapes).Bytes()
			text := "plain"
			if escapes {
				text = "escaped"
			}
			for _, impl := range []struct {
				name  string
				parse func(Kind, []byte) (*Request, error)
			}{{"old", refParse}, {"new", Parse}} {
				b.Run(fmt.Sprintf("body=%dKB/%s/%s", size>>10, text, impl.name), func(b *testing.B) {
					if _, err := impl.parse(KindChat, body); err != nil {
						b.Fatal(err)
					}
					b.SetBytes(int64(len(body)))
					b.ReportAllocs()
					for b.Loop() {
						if _, err := impl.parse(KindChat, body); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// TestParseAllocations bounds Parse's allocations: a few per request, none
// per message beyond the amortized growth of the shared message and part
// arrays (and of the arena that holds decoded texts), so at most a fraction
// of one per message.
func TestParseAllocations(t *testing.T) {
	for _, c := range []struct {
		name string
		body func(n int) []byte
	}{
		{"plain", func(n int) []byte { return chatBody(n, `hello there, how is the cache doing?`, "") }},
		{"escaped", func(n int) []byte { return chatBody(n, `line one\nline \"two\"`, "") }},
		{"multimodal", func(n int) []byte {
			return chatBody(n, "", `[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:x"}}]`)
		}},
		{"tool calls", func(n int) []byte {
			return chatBody(n, "", `null, "name": "bob", "tool_calls": [ {"id": "c", "function": {"name": "f"}} ]`)
		}},
	} {
		for _, n := range []int{10, 100, 1000} {
			body := c.body(n)
			req, err := Parse(KindChat, body)
			if err != nil || len(req.Messages) != n {
				t.Fatalf("%s: %v", c.name, err)
			}
			allocs := testing.AllocsPerRun(20, func() { _, _ = Parse(KindChat, body) })
			// Per request: the Request, the first message and part arrays,
			// the first arena chunk; then one doubling of each per doubling
			// of messages.
			budget := 6 + 3*float64(bitsLen(n))
			t.Logf("%s, %d messages: %.0f allocations (budget %.0f)", c.name, n, allocs, budget)
			if allocs > budget {
				t.Errorf("%s, %d messages: %.0f allocations, budget %.0f", c.name, n, allocs, budget)
			}
			if perMsg := allocs / float64(n); n >= 100 && perMsg > 0.5 {
				t.Errorf("%s, %d messages: %.2f allocations per message", c.name, n, perMsg)
			}
			// With reused buffers a parse allocates nothing once warm.
			var bufs Buffers
			_, _ = bufs.Parse(KindChat, body)
			if allocs := testing.AllocsPerRun(20, func() { _, _ = bufs.Parse(KindChat, body) }); allocs != 0 {
				t.Errorf("%s, %d messages, reused buffers: %.0f allocations", c.name, n, allocs)
			}
		}
	}
}

func bitsLen(n int) int { return len(strconv.FormatInt(int64(n), 2)) }

// chatBody is a chat body of n messages whose content is the string text, or
// the raw JSON content when text is empty.
func chatBody(n int, text, content string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		if text != "" {
			fmt.Fprintf(&b, `{"role":"user","content":"%d %s"}`, i, text)
		} else {
			fmt.Fprintf(&b, `{"role":"user","content":%s}`, content)
		}
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

// TestParseErrorAllocations: a body of many bad messages costs a bounded
// number of allocations, not one error per message.
func TestParseErrorAllocations(t *testing.T) {
	for _, item := range []string{`1`, `{"content":1}`, `{"role":"u","content":[1,{"type":"text","text":1}]}`} {
		body := []byte(`{"messages":[` + strings.TrimSuffix(strings.Repeat(item+",", 2000), ",") + `]}`)
		if _, err := Parse(KindChat, body); err == nil || isSyntaxError(err) {
			t.Fatalf("%s: %v", item, err)
		}
		if allocs := testing.AllocsPerRun(10, func() { _, _ = Parse(KindChat, body) }); allocs > 40 {
			t.Errorf("%s: %.0f allocations for 2000 bad messages", item, allocs)
		}
	}
}

// TestStringSpecialAtEveryOffset puts each kind of special string byte at
// every offset of strings up to 80 bytes long, across the scanner's 32- and
// 8-byte skips, and checks each body against the reference.
func TestStringSpecialAtEveryOffset(t *testing.T) {
	specials := []string{`\"`, `\n`, `\u00e9`, "é", "\x01", "\xff", `\x`, `"`}
	for _, sp := range specials {
		for n := 0; n <= 80; n++ {
			for at := 0; at <= n; at++ {
				text := strings.Repeat("a", at) + sp + strings.Repeat("b", n-at)
				body := []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`)
				checkAgainstReference(t, KindChat, body)
			}
		}
	}
}
