package chaos

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/server"
)

// TestChunkedJSONCutIsNotACleanAnswer checks that a non-streamed answer cut
// mid-body never reaches the client as a complete one. The replica answers
// 200 with a JSON body of unknown length (Transfer-Encoding: chunked, as
// Go's net/http does for a body flushed before the handler returns) and
// dies mid-body. proxy.relay reads only a body of known length whole, so
// this one goes through the stream relay, and a body that is not SSE has
// no in-band way to report the failure: the client must instead see an
// error (a transport error, a truncated chunked encoding, or a status >= 400
// with an OpenAI error body), never a well-formed 200 whose JSON is cut
// short.
//
// It guards the fix in proxy/stream.go: when the replica's body fails, the
// relay closes the client connection and ends the body with
// errStreamInterrupted, so fasthttp leaves the chunked body unterminated.
func TestChunkedJSONCutIsNotACleanAnswer(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"the and for`)
		w.(http.Flusher).Flush() // headers and a first chunk; no Content-Length
		time.Sleep(50 * time.Millisecond)
		panic(http.ErrAbortHandler) // the replica dies: connection closed mid-body
	})
	var lc net.ListenConfig
	rln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(rln) }()
	defer func() { _ = hs.Close() }()

	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", ""
	cfg.Timeouts.DrainDelay = 0
	cfg.Backends = []config.Backend{{Name: "a", URL: "http://" + rln.Addr().String(), Engine: "vllm"}}
	srv, err := server.New(cfg, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := lc.Listen(t.Context(), "tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Run(ctx, ln, nil); err != nil {
			t.Errorf("kvroute: %v", err)
		}
	}()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(5 * time.Second); len(srv.Fleet.Replicas()[0].Models()) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("kvroute did not fetch the replica's models")
		}
		time.Sleep(10 * time.Millisecond)
	}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+ln.Addr().String()+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return // a transport error at least tells the client
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return // so does a truncated chunked encoding
	}
	if resp.StatusCode == 200 && !json.Valid(body) {
		t.Errorf("lost: status 200, body ended cleanly but is cut short: %q", body)
	}
	if resp.StatusCode >= 400 {
		if _, ok := oaiError(body); !ok {
			t.Errorf("status %d without an OpenAI error body: %q", resp.StatusCode, body)
		}
	}
}
