package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// eventsFor is the stream the relay test's replica sends for seed: events
// of many sizes, one larger than a relay's buffer, one of 2 MiB that
// does not fit in the sockets' buffers, the usage, then [DONE].
func eventsFor(seed int) []string {
	ev := make([]string, 0, 14)
	for i := range 12 {
		size := (seed*7 + i*131) % 700
		switch i {
		case 5:
			size = 40 << 10
		case 9:
			size = 2 << 20
		}
		ev = append(ev, fmt.Sprintf("data: {\"i\":%d,\"s\":%d,\"pad\":%q}\n\n", i, seed, strings.Repeat("x", size)))
	}
	ev = append(ev, `data: {"usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n",
		"data: [DONE]\n\n")
	return ev
}

// TestPolledStreams: server-sent event streams relayed through the Poller
// reach their clients byte for byte, however the replica splits them and
// whatever their size, also to a client that stops reading for a while
// (the stream's goroutine then waits for it, and the Poller takes the
// stream back after); their replica connections go back to the pool.
func TestPolledStreams(t *testing.T) {
	var mu sync.Mutex
	addrs := map[string]int{} // kvroute's end of each replica connection, with its stream count
	rep := kvtest.NewReplica(t, "a", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		addrs[r.RemoteAddr]++
		mu.Unlock()
		seed, _ := strconv.Atoi(r.Header.Get("X-Seed"))
		w.Header().Set("Content-Type", "text/event-stream")
		for i, e := range eventsFor(seed) {
			// Some events in two writes, some together with the next.
			if i%3 == 0 {
				_, _ = io.WriteString(w, e[:len(e)/2])
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
				e = e[len(e)/2:]
			}
			_, _ = io.WriteString(w, e)
			if i%4 != 1 {
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
			}
		}
	})
	k := kvtest.Start(t, []*kvtest.Replica{rep})
	stream := func(seed int, pause time.Duration) error {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, k.URL+"/v1/chat/completions",
			strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Seed", strconv.Itoa(seed))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer func() { _ = resp.Body.Close() }()
		if pause > 0 {
			time.Sleep(pause) // the 2 MiB event fills the socket meanwhile
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if want := strings.Join(eventsFor(seed), ""); string(got) != want {
			return fmt.Errorf("stream %d: %d bytes, want %d (first difference at %d)", seed, len(got), len(want), firstDiff(string(got), want))
		}
		return nil
	}

	const parallel = 8
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	for i := range parallel {
		pause := time.Duration(0)
		if i%2 == 1 {
			pause = 300 * time.Millisecond
		}
		wg.Go(func() { errs <- stream(i, pause) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := k.Srv.Proxy.PolledStreams(); n != parallel {
		t.Errorf("PolledStreams() = %d, want %d: every stream relayed by the Poller", n, parallel)
	}
	if got := counterBy(t, k.Admin, "kvroute_streams_polled_total", "backend"); got["a"] != parallel {
		t.Errorf("kvroute_streams_polled_total by backend = %v, want a: %d", got, parallel)
	}
	kvtest.WaitFor(t, 5*time.Second, "the streams to settle", func() bool { return k.Srv.Proxy.InFlight() == 0 })

	// The next streams find a pooled connection: no new one is opened.
	// The connections of the streams above may have aged out of the pool
	// (idle past backends' 3 s) while the slowest ran, so one more stream
	// first, and the ones after it must reuse its connection.
	if err := stream(99, 0); err != nil {
		t.Fatal(err)
	}
	kvtest.WaitFor(t, 5*time.Second, "the stream to settle", func() bool { return k.Srv.Proxy.InFlight() == 0 })
	mu.Lock()
	before := len(addrs)
	mu.Unlock()
	for i := range 3 {
		if err := stream(100+i, 0); err != nil {
			t.Fatal(err)
		}
		kvtest.WaitFor(t, 5*time.Second, "the stream to settle", func() bool { return k.Srv.Proxy.InFlight() == 0 })
	}
	mu.Lock()
	defer mu.Unlock()
	if len(addrs) != before {
		t.Errorf("%d replica connections after 3 more streams, want %d: relayed streams' connections are reused", len(addrs), before)
	}
}

// firstDiff is the index of the first byte where a and b differ.
func firstDiff(a, b string) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
