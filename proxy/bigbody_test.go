package proxy_test

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// bigAnswer is a replica handler answering every request with body, of
// known length, written at once.
func bigAnswer(body []byte) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	}
}

// patterned returns n bytes that differ from offset to offset, so a
// reordered or repeated piece would show.
func patterned(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (i*7+i/4096)%26)
	}
	return b
}

// An answer larger than limits.max_buffered_response_bytes, read normally,
// arrives byte for byte with its Content-Length (not chunked).
func TestLargeAnswerKeepsLengthAndBytes(t *testing.T) {
	for _, size := range []int{1 << 20, 1<<20 + 1, 3 << 20} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			want := patterned(size)
			rep := kvtest.NewReplica(t, "a", bigAnswer(want))
			k := kvtest.Start(t, []*kvtest.Replica{rep})
			resp, err := httpPost(t, k.URL+"/v1/chat/completions", strings.NewReader(kvtest.ChatBody))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 200 || resp.ContentLength != int64(size) || len(resp.TransferEncoding) != 0 {
				t.Errorf("status %d, Content-Length %d, Transfer-Encoding %v; want 200, %d, none",
					resp.StatusCode, resp.ContentLength, resp.TransferEncoding, size)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("body differs: got %d bytes, want %d", len(got), size)
			}
			r := k.Srv.Fleet.ByName("a")
			kvtest.WaitFor(t, 5*time.Second, "in-flight counts to return to 0", func() bool {
				return k.Srv.Proxy.InFlight() == 0 && r.InFlight() == 0
			})
		})
	}
}

// Clients that never read 10 MB answers do not make kvroute hold them:
// answers past limits.max_buffered_response_bytes are relayed as the
// client takes them, so the heap grows by far less than the answers.
func TestUnreadLargeAnswersAreNotBuffered(t *testing.T) {
	const clients, answerBytes = 20, 10 << 20
	answer := patterned(answerBytes)
	rep := kvtest.NewReplica(t, "a", bigAnswer(answer))
	k := kvtest.Start(t, []*kvtest.Replica{rep})
	addr := strings.TrimPrefix(k.URL, "http://")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := 0; i < clients; i++ {
		stalledClient(t, addr, "/v1/chat/completions", kvtest.ChatBody)
	}
	kvtest.WaitFor(t, 10*time.Second, "every request to reach the replica", func() bool { return rep.Hits.Load() == clients })
	// Time for kvroute to read from the replica what it would buffer.
	time.Sleep(time.Second)
	runtime.GC()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if limit := int64(40 << 20); growth > limit {
		t.Errorf("heap grew by %d MB for %d unread answers of %d MB; want under %d MB",
			growth>>20, clients, answerBytes>>20, limit>>20)
	}
	t.Logf("heap growth with %d unread %d MB answers: %.1f MB", clients, answerBytes>>20, float64(growth)/(1<<20))
}

// An answer not yet written to its client still counts against
// limits.max_inflight, whether relayed as it arrives or read whole first
// (here, below a raised limits.max_buffered_response_bytes), and stops
// counting once its client is gone.
func TestUnwrittenAnswerCountsInFlight(t *testing.T) {
	for _, c := range []struct {
		name     string
		buffered int
	}{{"relayed", 0}, {"buffered", 16 << 20}} {
		t.Run(c.name, func(t *testing.T) {
			rep := kvtest.NewReplica(t, "a", bigAnswer(patterned(10<<20)))
			k := kvtest.Start(t, []*kvtest.Replica{rep}, func(cfg *config.Config) {
				cfg.Limits.MaxInflight = 1
				if c.buffered > 0 {
					cfg.Limits.MaxBufferedResponseBytes = c.buffered
				}
			})
			conn := stalledClient(t, strings.TrimPrefix(k.URL, "http://"), "/v1/chat/completions", kvtest.ChatBody)
			kvtest.WaitFor(t, 10*time.Second, "the request to reach the replica", func() bool { return rep.Hits.Load() == 1 })
			time.Sleep(300 * time.Millisecond) // kvroute has the answer, or its headers, by now

			resp, body := postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "overloaded") {
				t.Fatalf("second request while the first answer is unwritten: status %d %.80q; want 503 overloaded", resp.StatusCode, body)
			}
			if n := k.Srv.Proxy.InFlight(); n != 1 {
				t.Errorf("InFlight() = %d with one unwritten answer, want 1", n)
			}

			_ = conn.Close()
			kvtest.WaitFor(t, 10*time.Second, "the abandoned answer to settle", func() bool { return k.Srv.Proxy.InFlight() == 0 })
			resp, _ = postJSON(t, k.URL+"/v1/chat/completions", kvtest.ChatBody, nil)
			if resp.StatusCode != 200 {
				t.Errorf("after the stalled client left: status %d, want 200", resp.StatusCode)
			}
		})
	}
}

// A large answer whose replica fails mid-body does not reach its client as
// complete: the connection ends before the declared length.
func TestLargeAnswerCutByReplicaIsNotComplete(t *testing.T) {
	const declared = 3 << 20
	rep := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(declared))
		_, _ = w.Write(patterned(2 << 20))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	k := kvtest.Start(t, []*kvtest.Replica{rep})
	resp, err := httpPost(t, k.URL+"/v1/chat/completions", strings.NewReader(kvtest.ChatBody))
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err == nil || len(got) >= declared {
		t.Errorf("read %d of %d bytes with error %v; want the body cut short with an error", len(got), declared, err)
	}
	kvtest.WaitFor(t, 5*time.Second, "in-flight counts to return to 0", func() bool {
		return k.Srv.Proxy.InFlight() == 0 && k.Srv.Fleet.ByName("a").InFlight() == 0
	})
}

// The id of a Responses-API answer too large to buffer is still recorded
// for its replica, from the answer's first bytes.
func TestLargeResponsesAnswerRecordsItsID(t *testing.T) {
	body := []byte(`{"id":"resp_large_1","object":"response","output":[{"type":"message","content":[{"type":"output_text","text":"` +
		strings.Repeat("w", 2<<20) + `"}]}]}`)
	rep := kvtest.NewReplica(t, "a", bigAnswer(body))
	k := kvtest.Start(t, []*kvtest.Replica{rep})
	resp, got := postJSON(t, k.URL+"/v1/responses", `{"model":"m1","input":"hello"}`, nil)
	if resp.StatusCode != 200 || !bytes.Equal(got, body) {
		t.Fatalf("status %d, %d of %d bytes", resp.StatusCode, len(got), len(body))
	}
	kvtest.WaitFor(t, 5*time.Second, "the response id to be recorded", func() bool {
		r := k.Srv.Router.Responses().Lookup("resp_large_1")
		return r != nil && r.Name() == "a"
	})
}
