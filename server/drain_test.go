package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/internal/kvtest"
	"github.com/kvroute/kvroute/server"
)

// endlessStream answers /v1/chat/completions with server-sent events every
// 20ms until the client goes away (sent counts the events), and other paths
// with a small JSON completion.
func endlessStream(sent *atomic.Int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			kvtest.Echo(w, r, nil)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			sent.Add(1)
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// status returns the status of GET url, or 0 when it could not be sent.
func status(t testing.TB, url string) int {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := httpGet(t, c, url)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

func refused(t testing.TB, addr string) bool {
	c, err := dialTCP(t, addr, time.Second)
	if err != nil {
		return true
	}
	_ = c.Close()
	return false
}

// Shutdown in the order Kubernetes expects: /readyz is 503 at once, new
// connections are served during timeouts.drain_delay and refused after it,
// and a stream still open when timeouts.drain runs out ends with an SSE
// error event and an access-log line; the shutdown log counts it.
func TestDrainReadyzDelayAndCut(t *testing.T) {
	var sent atomic.Int64
	rep := kvtest.NewReplica(t, "a", endlessStream(&sent))
	cfg := kvtest.Config([]*kvtest.Replica{rep})
	cfg.Timeouts.DrainDelay = time.Second
	cfg.Timeouts.Drain = 500 * time.Millisecond
	core, logs := observer.New(zapcore.InfoLevel)
	srv, err := server.New(cfg, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	aln, err := listenLocal(t)
	if err != nil {
		t.Fatal(err)
	}
	addr, admin := ln.Addr().String(), "http://"+aln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, ln, aln) }()
	srv.Fleet.CheckNow(context.Background())
	if got := status(t, admin+"/readyz"); got != 200 {
		t.Fatalf("/readyz before shutdown: %d", got)
	}

	resp, err := httpPost(t, http.DefaultClient, "http://"+addr+"/v1/chat/completions",
		strings.NewReader(`{"stream":true,"messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	cancel() // what SIGTERM does in serve
	// No wait: the flag is set before Run's drain does anything else, but
	// Run learns of ctx asynchronously.
	kvtest.WaitFor(t, 500*time.Millisecond, "/readyz to answer 503", func() bool { return status(t, admin+"/readyz") == 503 })
	atCancel := sent.Load()
	drainsThenCuts(t, addr, br)
	if sent.Load() <= atCancel {
		t.Error("the stream got nothing during the drain")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}

	var cutLines int
	for _, e := range logs.FilterLoggerName("access").All() {
		m := e.ContextMap()
		if m["path"] == "/v1/chat/completions" && m["error"] == "drain_timeout" {
			cutLines++
		}
	}
	if cutLines != 1 {
		t.Errorf("%d access-log lines for the cut stream, want 1", cutLines)
	}
	final := logs.FilterMessageSnippet("shutdown complete").All()
	if len(final) != 1 {
		t.Fatalf("%d shutdown-complete log lines, want 1", len(final))
	}
	if got := final[0].ContextMap()["streams_cut"]; got != int64(1) {
		t.Errorf("shutdown log says streams_cut=%v, want 1", got)
	}
}

// drainsThenCuts checks what follows a shutdown's start for a kvroute
// listening on addr that relays a stream read through br: within
// drain_delay a new connection is accepted and served, then the listener
// refuses connections, and once the drain time runs out the stream ends
// cleanly with an SSE error event of code drain_timeout.
func drainsThenCuts(t *testing.T, addr string, br *bufio.Reader) {
	t.Helper()
	fresh := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	r2, err := httpPost(t, fresh, "http://"+addr+"/v1/completions", strings.NewReader(`{"model":"m1","prompt":"hi"}`))
	if err != nil {
		t.Fatalf("new connection during drain_delay: %v", err)
	}
	_ = r2.Body.Close()
	if r2.StatusCode != 200 {
		t.Fatalf("request on a new connection during drain_delay: status %d", r2.StatusCode)
	}
	kvtest.WaitFor(t, 10*time.Second, "the listener to refuse connections after drain_delay", func() bool { return refused(t, addr) })
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("cut stream did not end cleanly: %v", err)
	}
	events := strings.Split(strings.TrimSpace(string(rest)), "\n\n")
	last := events[len(events)-1]
	if !strings.HasPrefix(last, "data: {\"error\"") || !strings.Contains(last, `"code":"drain_timeout"`) {
		t.Fatalf("last event of the cut stream is %q, want an error event with code drain_timeout", last)
	}
}
