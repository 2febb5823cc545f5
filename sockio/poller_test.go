//go:build linux

package sockio

import (
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// drainer is a Handler that reads what its connection holds without
// waiting and reports each read on got.
type drainer struct {
	id   int
	c    *Conn
	got  chan<- string
	mu   sync.Mutex
	eof  bool
	read []byte
}

func (d *drainer) Ready() {
	d.mu.Lock()
	defer d.mu.Unlock()
	buf := make([]byte, 64)
	n, err := d.c.ReadNow(buf)
	switch {
	case n > 0:
		d.read = append(d.read, buf[:n]...)
		d.got <- string(buf[:n])
	case errors.Is(err, io.EOF):
		if !d.eof {
			d.eof = true
			d.got <- "EOF"
		}
	}
}

func TestPoller(t *testing.T) { testPoller(t) }

// testPoller: connections added to a Poller are served as their bytes
// arrive, each read once; a removed connection is not served; a closed
// one leaves the poller; ReadNow and WriteNow never wait.
// startPoller runs a Poller until stop, which the test's end also calls.
func startPoller(tb testing.TB) (p *Poller, stop func()) {
	tb.Helper()
	p, err := NewPoller()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	tb.Cleanup(stop)
	return p, stop
}

func testPoller(t *testing.T) {
	p, stop := startPoller(t)
	var err error

	got := make(chan string, 64)
	const conns = 3
	ds := make([]*drainer, conns)
	peers := make([]net.Conn, conns)
	toks := make([]Token, conns)
	for i := range ds {
		w, peer := pair(t)
		ds[i] = &drainer{id: i, c: w.(*Conn), got: got}
		peers[i] = peer
		if toks[i], err = p.Add(w, ds[i]); err != nil {
			t.Fatal(err)
		}
	}
	ds[0].mu.Lock() // the handler's reads and the test's, one at a time
	n, err := ds[0].c.ReadNow(make([]byte, 8))
	ds[0].mu.Unlock()
	if n != 0 || !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("ReadNow of an empty socket: %d, %v", n, err)
	}
	expect := func(want string) {
		t.Helper()
		select {
		case s := <-got:
			if s != want {
				t.Fatalf("served %q, want %q", s, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("nothing served, want %q", want)
		}
	}
	for i, msg := range []string{"a", "bb", "ccc"} {
		if _, err := peers[i].Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		expect(msg)
	}
	p.Remove(ds[1].c, toks[1])
	if _, err := peers[1].Write([]byte("not served")); err != nil {
		t.Fatal(err)
	}
	if _, err := peers[2].Write([]byte("served")); err != nil {
		t.Fatal(err)
	}
	expect("served")
	// The end of a stream is served too, once.
	_ = peers[0].Close()
	expect("EOF")
	// A closed connection leaves the poller; Add of it fails.
	_ = ds[2].c.Close()
	if _, err := p.Add(ds[2].c, ds[2]); err == nil {
		t.Fatal("Add of a closed connection succeeded")
	}
	select {
	case s := <-got:
		t.Fatalf("served %q after removal and close", s)
	case <-time.After(50 * time.Millisecond):
	}
	// A token whose slot was freed and used again does not reach the new
	// handler from a stale event: generations differ.
	w, peer := pair(t)
	d := &drainer{c: w.(*Conn), got: got}
	tok, err := p.Add(w, d)
	if err != nil {
		t.Fatal(err)
	}
	if tok.slot != toks[1].slot || tok.gen == toks[1].gen {
		t.Fatalf("slot reuse: %+v after %+v", tok, toks[1])
	}
	if _, err := peer.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	expect("new")

	// WriteNow takes what fits and says the rest would wait.
	big := make([]byte, 64<<20)
	n, err = d.c.WriteNow(big)
	if n == 0 || n == len(big) || !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("WriteNow of 64 MiB to a peer that does not read: %d, %v", n, err)
	}
	stop()
	if _, err := p.Add(w, d); err == nil {
		t.Fatal("Add after Run ended succeeded")
	}
}

// wakeHandler reports the time its connection's byte was served.
type wakeHandler struct {
	c   *Conn
	buf []byte
	got chan time.Time
}

func (h *wakeHandler) Ready() {
	if n, _ := h.c.ReadNow(h.buf); n > 0 {
		h.got <- time.Now()
	}
}

// BenchmarkPollerWake: one byte written to one of 64 idle connections at a
// time, from the write to the Poller's handler; it reports the p99 of that
// delay. Run with GOMAXPROCS=1 to see a router confined to one core.
func BenchmarkPollerWake(b *testing.B) {
	p, _ := startPoller(b)
	got := make(chan time.Time, 1)
	peers := make([]net.Conn, 0, 64)
	for range 64 {
		w, peer := pair(b)
		if _, err := p.Add(w, &wakeHandler{c: w.(*Conn), buf: make([]byte, 64), got: got}); err != nil {
			b.Fatal(err)
		}
		peers = append(peers, peer)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		if _, err := peers[i%len(peers)].Write([]byte{'x'}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, (<-got).Sub(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
