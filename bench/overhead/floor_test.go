package overhead

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The floor relay sends requests round robin over its upstreams and hands
// back their answers; an upstream it cannot reach gets 502.
func TestServeFloor(t *testing.T) {
	ups := make([]string, 0, 3)
	for i := range 2 {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			_, _ = fmt.Fprintf(w, "up-%d %s %s", i, r.URL.Path, body)
		}))
		t.Cleanup(s.Close)
		ups = append(ups, s.URL)
	}
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	ups = append(ups, deadURL)

	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeFloor(ctx, ln, ups) }()
	var got []string
	for range 6 {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions", strings.NewReader("hi"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusBadGateway {
			got = append(got, "502")
			continue
		}
		got = append(got, string(b))
	}
	want := "up-1 /v1/chat/completions hi|502|up-0 /v1/chat/completions hi|up-1 /v1/chat/completions hi|502|up-0 /v1/chat/completions hi"
	if strings.Join(got, "|") != want {
		t.Errorf("answers %q, want %q", strings.Join(got, "|"), want)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("ServeFloor: %v", err)
	}
	if err := ServeFloor(context.Background(), ln, []string{"ftp://x"}); err == nil {
		t.Error("an ftp upstream was accepted")
	}
}

// The floor target runs when named, never by default.
func TestFloorTargetIsOptIn(t *testing.T) {
	cases := []struct {
		targets []string
		floor   bool
	}{
		{nil, false},
		{[]string{"all"}, false},
		{[]string{"floor", "round_robin"}, true},
		{[]string{"all", "floor"}, true},
	}
	for _, tc := range cases {
		o := DefaultOptions()
		o.Targets = tc.targets
		got, _, err := o.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if has := strings.Contains(strings.Join(got.Targets, ","), TargetFloor); has != tc.floor {
			t.Errorf("targets %v resolve to %v", tc.targets, got.Targets)
		}
	}
}
