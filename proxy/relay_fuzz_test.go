package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// FuzzSSERelay sends arbitrary replica bytes, split into arbitrary flushed
// pieces, through kvroute's stream relay: the client must receive exactly
// the replica's bytes, and the replica's in-flight count must return to 0.
func FuzzSSERelay(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"), uint8(7))
	f.Add([]byte("data: {\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n"), uint8(1))
	f.Add([]byte(""), uint8(0))
	f.Add([]byte("\x00\xff\r\n\r\n: comment\n\n"), uint8(3))
	var payload atomic.Pointer[[]byte]
	var split atomic.Int32
	rep := kvtest.NewReplica(f, "a", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		b := *payload.Load()
		step := int(split.Load())%64 + 1
		for len(b) > 0 {
			n := min(step, len(b))
			_, _ = w.Write(b[:n])
			w.(http.Flusher).Flush()
			b = b[n:]
		}
	})
	k := kvtest.Start(f, []*kvtest.Replica{rep})
	body := `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}]}`
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		payload.Store(&data)
		split.Store(int32(step))
		resp, err := httpPost(t, k.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("relay changed the stream: sent %d bytes, got %d", len(data), len(got))
		}
		r := k.Srv.Fleet.ByName("a")
		kvtest.WaitFor(t, 2e9, "in flight zero", func() bool { return r.InFlight() == 0 })
	})
}
