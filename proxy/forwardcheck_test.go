package proxy

import (
	"strings"
	"testing"
)

func TestValidFieldNames(t *testing.T) {
	tests := []struct {
		raw  string
		want bool
	}{
		{"", true},
		{"\r\n", true},
		{"Host: x\r\nContent-Type: application/json\r\n\r\n", true},
		{"X-Odd!#$%&'*+-.^_`|~09az: v\r\n\r\n", true},
		{"X-Folded: a\r\n  b\r\nHost: x\r\n\r\n", true},
		{"Host: x\nX-Bare-LF: y\n\n", true},
		{"X Bad: 1\r\n\r\n", false},
		{"Host: x\r\nX-Bad : 1\r\n\r\n", false},
		{"X(Bad): 1\r\n\r\n", false},
		{"X\"Bad\": 1\r\n\r\n", false},
		{"X-Bad\x7f: 1\r\n\r\n", false},
		{"X-Bad\xc3\xa9: 1\r\n\r\n", false},
		{": no name\r\n\r\n", false},
		{"no colon\r\n\r\n", false},
	}
	for _, tt := range tests {
		if got := validFieldNames([]byte(tt.raw)); got != tt.want {
			t.Errorf("validFieldNames(%q) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

func TestMethodAllowed(t *testing.T) {
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		if !methodAllowed([]byte(m)) {
			t.Errorf("%s refused", m)
		}
		if !strings.Contains(allowedMethods, m) {
			t.Errorf("%s missing from the Allow value %q", m, allowedMethods)
		}
	}
	for _, m := range []string{"CONNECT", "TRACE", "PROPFIND", "get", "Post", "BREW", ""} {
		if methodAllowed([]byte(m)) {
			t.Errorf("%q allowed", m)
		}
	}
}

// The request checks run on every request: they allocate nothing (the
// response-head checks, backends' TestHeadChecksAllocateNothing).
func TestForwardChecksAllocateNothing(t *testing.T) {
	raw := []byte("Host: kvroute.example\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-x\r\nX-Session-ID: s1\r\nContent-Length: 61\r\n\r\n")
	method := []byte("POST")
	allocs := testing.AllocsPerRun(100, func() {
		if !methodAllowed(method) || !validFieldNames(raw) {
			t.Fatal("refused")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request", allocs)
	}
}
