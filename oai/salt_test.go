package oai

import (
	"errors"
	"strings"
	"testing"
)

func TestParseCacheSalt(t *testing.T) {
	long := strings.Repeat("s", MaxCacheSaltBytes)
	for _, c := range []struct {
		kind Kind
		body string
		salt string
		err  string
	}{
		{KindChat, `{"messages":[{"role":"u","content":"x"}],"cache_salt":"tenant-a"}`, "tenant-a", ""},
		{KindCompletion, `{"prompt":"x","cache_salt":"b"}`, "b", ""},
		{KindResponses, `{"input":"x","cache_salt":"c"}`, "c", ""},
		{KindChat, `{"messages":[{"role":"u"}],"cache_salt":null}`, "", ""},
		{KindChat, `{"messages":[{"role":"u"}],"cache_s\u0061lt":"e\u0301"}`, "e\u0301", ""},
		{KindChat, `{"messages":[{"role":"u"}],"cache_salt":"` + long + `"}`, long, ""},
		{KindChat, `{"messages":[{"role":"u"}],"cache_salt":"` + long + `x"}`, "", "'cache_salt' must be at most 256 bytes"},
		{KindChat, `{"messages":[{"role":"u"}],"cache_salt":7}`, "", "'cache_salt' must be a string"},
	} {
		req, err := Parse(c.kind, []byte(c.body))
		if c.err != "" {
			var e *Error
			ok := errors.As(err, &e)
			if !ok || e.Message != c.err || e.Param != "cache_salt" || e.Status != 400 {
				t.Errorf("%s: error %v, want %q", c.body, err, c.err)
			}
			if ok && strings.Contains(string(e.Body()), "sss") {
				t.Errorf("%s: the error quotes the salt", c.body)
			}
			continue
		}
		if err != nil || req.CacheSalt != c.salt {
			t.Errorf("%.60s: salt %q, %v; want %q", c.body, req.CacheSalt, err, c.salt)
		}
	}
}

// TestParseTruncatesPastBudget: a body of a million empty parts keeps the
// first parts that fit the budget and says it is truncated; an ordinary
// body is not.
func TestParseTruncatesPastBudget(t *testing.T) {
	body := []byte(`{"messages":[{"role":"a","content":"x"},{"role":"u","content":[` +
		strings.TrimSuffix(strings.Repeat(`{},`, 1_000_000), ",") + `]}]}`)
	req, err := Parse(KindChat, body)
	if err != nil {
		t.Fatal(err)
	}
	if !req.Truncated || len(req.Messages) != 1 || req.Messages[0].Parts[0].Text != "x" {
		t.Fatalf("truncated %v, %d messages", req.Truncated, len(req.Messages))
	}
	body = chatBody(1000, "hello", "")
	if req, err = Parse(KindChat, body); err != nil || req.Truncated || len(req.Messages) != 1000 {
		t.Fatalf("ordinary body: %v, truncated %v", err, req.Truncated)
	}
}
