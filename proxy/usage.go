package proxy

import "bytes"

var (
	cachedField = []byte(`"cached_tokens"`)
	promptField = []byte(`"prompt_tokens"`)
)

// scanUsage finds usage.prompt_tokens and
// usage.prompt_tokens_details.cached_tokens in a response body or SSE chunk
// without decoding it. ok is false when no cached_tokens number is present.
func scanUsage(b []byte) (prompt, cached int, ok bool) {
	i := bytes.Index(b, cachedField)
	if i < 0 {
		return 0, 0, false
	}
	cached, ok = numberAfter(b[i+len(cachedField):])
	if !ok {
		return 0, 0, false
	}
	if j := bytes.Index(b, promptField); j >= 0 {
		prompt, _ = numberAfter(b[j+len(promptField):])
	}
	return prompt, cached, true
}

// numberAfter parses `  :  123` at the start of b.
func numberAfter(b []byte) (int, bool) {
	i := 0
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	if i >= len(b) || b[i] != ':' {
		return 0, false
	}
	i++
	for i < len(b) && (b[i] == ' ' || b[i] == '\t') {
		i++
	}
	n, digits := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9' && digits < 12; i++ {
		n = n*10 + int(b[i]-'0')
		digits++
	}
	return n, digits > 0
}
