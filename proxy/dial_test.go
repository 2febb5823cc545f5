package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// deadlineCounter counts the read deadlines set on a real connection.
type deadlineCounter struct {
	net.Conn
	set []time.Time
}

func (c *deadlineCounter) SetReadDeadline(t time.Time) error {
	c.set = append(c.set, t)
	return c.Conn.SetReadDeadline(t)
}

// loopbackPair returns both ends of a TCP connection on 127.0.0.1.
func loopbackPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _, _ = client.Close(), server.Close() })
	return client, server
}

func TestTimedConnDeadlines(t *testing.T) {
	client, server := loopbackPair(t)
	d := NewDialer(time.Second, 10*time.Second, 5*time.Second)
	dc := &deadlineCounter{Conn: client}
	c := &timedConn{Conn: dc, d: d}
	buf := make([]byte, 16)
	roundTrip := func(chunks int) {
		t.Helper()
		if _, err := c.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(server, make([]byte, 7)); err != nil {
			t.Fatal(err)
		}
		for range chunks {
			if _, err := server.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Read(buf); err != nil {
				t.Fatal(err)
			}
		}
	}
	steps := []struct {
		name   string
		chunks int
		want   int // deadlines set so far
	}{
		// The first read waits for the first byte; the second switches to
		// the idle wait; the third keeps that deadline.
		{"three chunks", 3, 2},
		// The next request waits for its first byte again.
		{"next request", 1, 3},
		// A request right after, read in one piece, keeps that deadline.
		{"request after", 1, 3},
	}
	for _, st := range steps {
		roundTrip(st.chunks)
		if len(dc.set) != st.want {
			t.Fatalf("%s: %d deadlines set, want %d", st.name, len(dc.set), st.want)
		}
	}
	for i, dl := range dc.set {
		if left := time.Until(dl); left <= 0 || left > 10*time.Second {
			t.Fatalf("deadline %d is %v away", i, left)
		}
	}
	// Timeouts switched off clear the deadline once.
	d.SetTimeouts(0, 0)
	roundTrip(2)
	if len(dc.set) != 4 || !dc.set[3].IsZero() {
		t.Fatalf("after switching timeouts off: deadlines %v", dc.set)
	}
}

// A replica that never answers times out no sooner than the first-byte
// wait less its slack.
func TestTimedConnFirstByteTimeout(t *testing.T) {
	client, server := loopbackPair(t)
	const wait = 200 * time.Millisecond
	c := &timedConn{Conn: client, d: NewDialer(time.Second, wait, time.Hour)}
	if _, err := c.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(server, make([]byte, 7)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.Read(make([]byte, 16))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of a silent replica: %v, want a deadline error", err)
	}
	if elapsed := time.Since(start); elapsed < wait-wait/deadlineSlack {
		t.Fatalf("timed out after %v, before %v", elapsed, wait-wait/deadlineSlack)
	}
}
