package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// CutStreams ends streams whose replica has gone silent (the relay is
// blocked reading it): an SSE stream with a drain_timeout error event, a
// stream of another type by closing the connection; each gets its
// access-log line, and the replica's connection is closed.
func TestCutStreamsEndsSilentStreams(t *testing.T) {
	replicaGone := make(chan string, 2)
	silent := func(w http.ResponseWriter, r *http.Request) {
		ct := "text/event-stream"
		if r.URL.Path == "/v1/completions" {
			ct = "application/x-ndjson"
		}
		w.Header().Set("Content-Type", ct)
		_, _ = fmt.Fprint(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done(): // kvroute closed the connection
			replicaGone <- r.URL.Path
		case <-time.After(20 * time.Second):
		}
	}
	core, logs := observer.New(zapcore.InfoLevel)
	k := kvtest.StartLogged(t, zap.New(core), []*kvtest.Replica{kvtest.NewReplica(t, "a", silent)})

	open := func(path, body string) *bufio.Reader {
		t.Helper()
		resp, err := httpPost(t, k.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		return br
	}
	sse := open("/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	other := open("/v1/completions", `{"model":"m1","prompt":"x","stream":true}`)
	kvtest.WaitFor(t, 2*time.Second, "both streams listed", func() bool { return k.Srv.Proxy.Streams() == 2 })

	// Well under the replica's stream_idle (5s), after which the relay
	// would wake up anyway.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if n := k.Srv.Proxy.CutStreams(ctx); n != 2 {
		t.Fatalf("CutStreams cut %d streams, want 2", n)
	}
	rest, err := io.ReadAll(sse)
	if err != nil {
		t.Fatalf("cut SSE stream did not end cleanly: %v", err)
	}
	if s := strings.TrimSpace(string(rest)); !strings.HasPrefix(s, "data: {\"error\"") || !strings.Contains(s, `"code":"drain_timeout"`) {
		t.Fatalf("cut SSE stream ended with %q, want a drain_timeout error event", s)
	}
	if _, err := io.ReadAll(other); err == nil {
		t.Error("cut non-SSE stream ended as if complete")
	}
	for i := 0; i < 2; i++ {
		select {
		case <-replicaGone:
		case <-time.After(5 * time.Second):
			t.Fatal("the replica's connection of a cut stream stayed open")
		}
	}
	n := 0
	for _, e := range logs.FilterLoggerName("access").All() {
		if e.ContextMap()["error"] == "drain_timeout" {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d access-log lines with error drain_timeout, want 2", n)
	}
	if k.Srv.Proxy.Streams() != 0 || k.Srv.Proxy.InFlight() != 0 {
		t.Errorf("after the cut: %d streams, %d requests in flight", k.Srv.Proxy.Streams(), k.Srv.Proxy.InFlight())
	}
}
