package proxy

import "testing"

func TestScanUsage(t *testing.T) {
	cases := []struct {
		in             string
		prompt, cached int
		ok             bool
	}{
		{`{"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":256}}}`, 300, 256, true},
		{`data: {"usage": {"prompt_tokens" : 12, "prompt_tokens_details": {"cached_tokens" :0}}}`, 12, 0, true},
		{`{"usage":{"prompt_tokens":300}}`, 0, 0, false},
		{`{"usage":{"prompt_tokens_details":{"cached_tokens":null}}}`, 0, 0, false},
		{`"cached_tokens"`, 0, 0, false},
		{``, 0, 0, false},
	}
	for _, c := range cases {
		p, k, ok := scanUsage([]byte(c.in))
		if p != c.prompt || k != c.cached || ok != c.ok {
			t.Errorf("scanUsage(%q) = %d,%d,%v want %d,%d,%v", c.in, p, k, ok, c.prompt, c.cached, c.ok)
		}
	}
}

// FuzzScanUsage: replica bytes are untrusted; the scanner never panics and
// never reports a negative or absurd count.
func FuzzScanUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":300,"prompt_tokens_details":{"cached_tokens":256}}}`))
	f.Add([]byte(`data: {"cached_tokens":`))
	f.Add([]byte(`"prompt_tokens":99999999999999999999,"cached_tokens":1`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, c, ok := scanUsage(b)
		if !ok && (p != 0 || c != 0) {
			t.Fatal("values without ok")
		}
		if p < 0 || c < 0 || p >= 1e12 || c >= 1e12 {
			t.Fatalf("absurd counts %d %d", p, c)
		}
	})
}
