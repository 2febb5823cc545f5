//go:build linux

package sockio

import (
	"context"
	"errors"
	"io"
	"net"
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

func TestPoller(t *testing.T) { bothModes(t, testPoller) }

// testPoller: connections added to a Poller are served as their bytes
// arrive, each read once; a removed connection is not served; a closed
// one leaves the poller; ReadNow and WriteNow never wait.
func testPoller(t *testing.T, raw bool) {
	p, err := NewPoller()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	got := make(chan string, 64)
	const conns = 3
	ds := make([]*drainer, conns)
	peers := make([]net.Conn, conns)
	toks := make([]Token, conns)
	for i := range ds {
		w, peer := pair(t, raw)
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
	w, peer := pair(t, raw)
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
	cancel()
	<-done
	if _, err := p.Add(w, d); err == nil {
		t.Fatal("Add after Run ended succeeded")
	}
}
