package cli

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// writes records each write the buffer makes, in order.
type writes struct {
	mu sync.Mutex
	w  [][]byte
}

func (r *writes) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.w = append(r.w, bytes.Clone(p))
	return len(p), nil
}

func (r *writes) all() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.w...)
}

// Lines wait until the buffer would overflow or is synced; every write
// holds whole lines, in the order they came, and a line larger than the
// buffer goes out on its own after those before it.
func TestLineBufferKeepsLinesWhole(t *testing.T) {
	line := func(c byte, n int) []byte { return append(bytes.Repeat([]byte{c}, n-1), '\n') }
	big := line('z', logBufferBytes+1)
	for _, c := range []struct {
		name  string
		lines [][]byte
		want  []int // lines per write, Sync's included
	}{
		{"held until sync", [][]byte{line('a', 100), line('b', 100)}, []int{2}},
		{"overflow writes what came before", [][]byte{line('a', logBufferBytes/2), line('b', logBufferBytes/2), line('c', 10)}, []int{2, 1}},
		{"exactly full stays", [][]byte{line('a', logBufferBytes/2), line('b', logBufferBytes/2)}, []int{2}},
		{"a line past the buffer goes alone", [][]byte{line('a', 10), big, line('c', 10)}, []int{1, 1, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := &writes{}
			b := newLineBuffer(out)
			var want []byte
			for _, l := range c.lines {
				if n, err := b.Write(l); n != len(l) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
				want = append(want, l...)
			}
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			var got []byte
			per := make([]int, 0, len(out.all()))
			for _, w := range out.all() {
				if len(w) == 0 || w[len(w)-1] != '\n' {
					t.Errorf("a write ends inside a line (%d bytes)", len(w))
				}
				per = append(per, bytes.Count(w, []byte("\n")))
				got = append(got, w...)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("wrote %d bytes, want the %d given in order", len(got), len(want))
			}
			if !slices.Equal(per, c.want) {
				t.Errorf("lines per write %v, want %v", per, c.want)
			}
		})
	}
}

// Through a logger: info lines wait, a warning goes out at once with the
// lines before it, and the flush loop writes what waits every interval
// and once more when its context ends.
func TestBufferedLoggerFlushes(t *testing.T) {
	out := &writes{}
	buf := newLineBuffer(out)
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(&flushCore{Core: zapcore.NewCore(enc, buf, zapcore.InfoLevel), buf: buf}).Named("access")
	log.Info("request", zap.Int("status", 200))
	log.Debug("not logged")
	if n := len(out.all()); n != 0 {
		t.Fatalf("an info line was written at once (%d writes)", n)
	}
	log.With(zap.String("replica", "r0")).Warn("replica ejected")
	w := out.all()
	if len(w) != 1 || !strings.Contains(string(w[0]), `"msg":"request"`) || !strings.Contains(string(w[0]), `"msg":"replica ejected","replica":"r0"`) {
		t.Fatalf("after a warning: %q, want one write of both lines", w)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { buf.run(ctx, 10*time.Millisecond); close(done) }()
	log.Info("request", zap.Int("status", 201))
	for deadline := time.Now().Add(10 * time.Second); len(out.all()) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the flush loop never wrote the waiting line")
		}
	}
	if got := string(out.all()[1]); !strings.Contains(got, `"status":201`) {
		t.Errorf("flushed %q", got)
	}
	log.Info("request", zap.Int("status", 202))
	cancel()
	<-done
	if w := out.all(); !strings.Contains(string(w[len(w)-1]), `"status":202`) {
		t.Errorf("the line logged before the end was not written: %q", w)
	}
}
