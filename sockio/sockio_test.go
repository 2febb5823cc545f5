//go:build linux

package sockio

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/loopback"
)

// pair returns a connected pair over 127.0.0.1: the dialed end wrapped,
// and the accepted end as the net package gives it.
func pair(t testing.TB) (wrapped, peer net.Conn) {
	t.Helper()
	c, p := loopback.Pair(t)
	w := Wrap(c)
	t.Cleanup(func() { _ = w.Close() })
	return w, p
}

func TestWrapOnlyTCP(t *testing.T) { testWrapOnlyTCP(t) }

func testWrapOnlyTCP(t *testing.T) {
	w, _ := pair(t)
	if _, ok := w.(*Conn); !ok {
		t.Fatalf("Wrap of a TCP connection gave %T", w)
	}
	a, b := net.Pipe()
	defer func() { _, _ = a.Close(), b.Close() }()
	if got := Wrap(a); got != a {
		t.Fatalf("Wrap of a pipe gave %T, want it as is", got)
	}
	if _, ok := w.(interface {
		SyscallConn() (syscall.RawConn, error)
	}); !ok {
		t.Fatal("the wrapped connection lost SyscallConn")
	}
}

// TestCopyBothWays sends random bytes in random pieces through the wrapped
// end in both directions and wants them back whole and in order, as the
// net package's own connection gives them.
func TestCopyBothWays(t *testing.T) { testCopyBothWays(t) }

func testCopyBothWays(t *testing.T) {
	for _, tc := range []struct {
		name  string
		total int
		piece int
	}{
		{"small pieces", 64 << 10, 100},
		{"pieces past the socket buffer", 16 << 20, 1 << 20},
		{"one byte", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p := pair(t)
			rng := rand.New(rand.NewPCG(1, uint64(tc.total)))
			data := make([]byte, tc.total)
			for i := range data {
				data[i] = byte(rng.Uint32())
			}
			for _, dir := range []struct {
				name     string
				src, dst net.Conn
			}{{"wrapped writes", w, p}, {"wrapped reads", p, w}} {
				errc := make(chan error, 1)
				wrng := rand.New(rand.NewPCG(2, uint64(tc.total)))
				go func() {
					rest := data
					for len(rest) > 0 {
						k := min(len(rest), 1+wrng.IntN(tc.piece))
						n, err := dir.src.Write(rest[:k])
						if err != nil {
							errc <- err
							return
						}
						if n != k {
							errc <- errors.New("short write without an error")
							return
						}
						rest = rest[k:]
					}
					errc <- nil
				}()
				got := make([]byte, 0, len(data))
				buf := make([]byte, 1+rng.IntN(64<<10))
				for len(got) < len(data) {
					n, err := dir.dst.Read(buf)
					if err != nil {
						t.Fatalf("%s: read after %d bytes: %v", dir.name, len(got), err)
					}
					got = append(got, buf[:n]...)
				}
				if err := <-errc; err != nil {
					t.Fatalf("%s: write: %v", dir.name, err)
				}
				if !bytes.Equal(got, data) {
					t.Fatalf("%s: bytes differ", dir.name)
				}
			}
		})
	}
}

func TestReadEnds(t *testing.T) { testReadEnds(t) }

func testReadEnds(t *testing.T) {
	t.Run("EOF when the peer closes", func(t *testing.T) {
		w, p := pair(t)
		if _, err := p.Write([]byte("last")); err != nil {
			t.Fatal(err)
		}
		_ = p.Close()
		got, err := io.ReadAll(w)
		if err != nil || string(got) != "last" {
			t.Fatalf("ReadAll = %q, %v; want \"last\", nil", got, err)
		}
	})
	t.Run("zero-length read", func(t *testing.T) {
		w, _ := pair(t)
		if n, err := w.Read(nil); n != 0 || err != nil {
			t.Fatalf("Read(nil) = %d, %v", n, err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		w, _ := pair(t)
		_ = w.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, err := w.Read(make([]byte, 8))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past its deadline = %v, want a timeout", err)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "read" {
			t.Fatalf("Read past its deadline = %#v, want a read OpError", err)
		}
	})
	t.Run("Close from another goroutine", func(t *testing.T) {
		w, _ := pair(t)
		go func() {
			time.Sleep(20 * time.Millisecond)
			_ = w.Close()
		}()
		_, err := w.Read(make([]byte, 8))
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read of a connection closed under it = %v, want net.ErrClosed", err)
		}
	})
	t.Run("reset", func(t *testing.T) {
		w, p := pair(t)
		_ = p.(*net.TCPConn).SetLinger(0)
		_ = p.Close()
		_, err := w.Read(make([]byte, 8))
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Read of a reset connection = %v, want ECONNRESET", err)
		}
	})
}

func TestWriteEnds(t *testing.T) { testWriteEnds(t) }

func testWriteEnds(t *testing.T) {
	t.Run("deadline with a full buffer", func(t *testing.T) {
		w, _ := pair(t)
		big := make([]byte, 64<<20)
		_ = w.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
		n, err := w.Write(big)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write past its deadline = %d, %v; want a timeout", n, err)
		}
		if n <= 0 || n >= 64<<20 {
			t.Fatalf("Write past its deadline wrote %d bytes, want part of them", n)
		}
	})
	t.Run("peer gone", func(t *testing.T) {
		w, p := pair(t)
		_ = p.(*net.TCPConn).SetLinger(0)
		_ = p.Close()
		time.Sleep(10 * time.Millisecond)
		var err error
		for range 100 {
			if _, err = w.Write([]byte("x")); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("Write to a reset connection = %v, want ECONNRESET or EPIPE", err)
		}
	})
	t.Run("after Close", func(t *testing.T) {
		w, _ := pair(t)
		_ = w.Close()
		if _, err := w.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write after Close = %v, want net.ErrClosed", err)
		}
	})
}

// BenchmarkPingPong sends a 200-byte message and reads it back through an
// echo peer: one write and one read per side, as a relayed event costs.
func BenchmarkPingPong(b *testing.B) {
	for _, wrap := range []bool{false, true} {
		name := "net"
		if wrap {
			name = "sockio"
		}
		b.Run(name, func(b *testing.B) {
			w, p := pair(b)
			if !wrap {
				w = w.(*Conn).TCPConn
			}
			go func() { _, _ = io.Copy(p, p) }()
			msg := bytes.Repeat([]byte("e"), 200)
			buf := make([]byte, 4096)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(w, buf[:len(msg)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestPeek(t *testing.T) { testPeek(t) }

func testPeek(t *testing.T) {
	peek := func(c net.Conn) (int, syscall.Errno) {
		rc, ok := SyscallConn(c)
		if !ok {
			t.Fatalf("SyscallConn found no socket under %T", c)
		}
		var n int
		var e syscall.Errno
		if err := rc.Control(func(fd uintptr) { n, e = Peek(fd) }); err != nil {
			t.Fatal(err)
		}
		return n, e
	}
	for _, tc := range []struct {
		name  string
		peer  func(t *testing.T, p net.Conn)
		wantN int
		want  syscall.Errno
	}{
		{"nothing yet", func(*testing.T, net.Conn) {}, 0, syscall.EAGAIN},
		{"bytes", func(t *testing.T, p net.Conn) {
			if _, err := p.Write([]byte("ab")); err != nil {
				t.Fatal(err)
			}
		}, 1, 0},
		{"end of stream", func(_ *testing.T, p net.Conn) { _ = p.Close() }, 0, 0},
		{"reset", func(_ *testing.T, p net.Conn) {
			_ = p.(*net.TCPConn).SetLinger(0)
			_ = p.Close()
		}, 0, syscall.ECONNRESET},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, p := pair(t)
			tc.peer(t, p)
			var n int
			var e syscall.Errno
			// What the peer did reaches the socket within moments.
			for range 200 {
				if n, e = peek(w); n == tc.wantN && e == tc.want {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if n != tc.wantN || e != tc.want {
				t.Fatalf("Peek = %d, %v; want %d, %v", n, e, tc.wantN, tc.want)
			}
			if tc.name == "bytes" {
				// Peeking read nothing.
				got, err := io.ReadAll(io.LimitReader(w, 2))
				if err != nil || string(got) != "ab" {
					t.Fatalf("after Peek, read %q, %v", got, err)
				}
			}
		})
	}
}

// The first Read after a Write lets other runnable goroutines go first:
// on one processor, a goroutine made runnable just before that Read has
// usually run by the time it returns, though the bytes were already there
// (not always: the scheduler now and then takes the yielding goroutine
// back first, for fairness). Without the yield it would almost never have.
func TestReadAfterWriteYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	w, p := pair(t)
	buf := make([]byte, 16)
	const rounds = 200
	ran := 0
	for range rounds {
		if _, err := w.Write([]byte("request")); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		var other atomic.Bool
		go other.Store(true)
		if _, err := w.Read(buf); err != nil {
			t.Fatal(err)
		}
		if other.Load() {
			ran++
		}
	}
	if ran < rounds*3/4 {
		t.Fatalf("the runnable goroutine had run before Read returned in %d of %d rounds", ran, rounds)
	}
}
