package cli

import (
	"context"
	"io"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
)

// logBufferBytes is what a lineBuffer holds before it writes: at 20,000
// access lines a second (about 350 bytes each) one write every 10 ms
// instead of one per line.
const logBufferBytes = 64 << 10

// lineBuffer is the log's output when log.flush_interval is set: the
// lines zap writes (one Write per entry) gather in memory and go out in
// one write when the buffer would overflow, at every flush interval
// (run), at every entry of level warn or above (flushCore), and on Sync.
// A write never splits a line, so lines written by another process to
// the same file or pipe never land inside one; zap's own
// BufferedWriteSyncer, a bufio.Writer, cuts a line that does not fit
// across two writes.
type lineBuffer struct {
	mu  sync.Mutex
	out io.Writer
	buf []byte
	err error // the last write's error, returned by the next Sync
}

func newLineBuffer(out io.Writer) *lineBuffer {
	return &lineBuffer{out: out, buf: make([]byte, 0, logBufferBytes)}
}

// Write implements zapcore.WriteSyncer. It always takes all of p.
func (b *lineBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf)+len(p) > cap(b.buf) {
		b.flushLocked()
	}
	if len(p) > cap(b.buf) {
		_, err := b.out.Write(p)
		return len(p), err
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Sync writes what the buffer holds.
func (b *lineBuffer) Sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.flushLocked()
	err := b.err
	b.err = nil
	return err
}

func (b *lineBuffer) flushLocked() {
	if len(b.buf) == 0 {
		return
	}
	if _, err := b.out.Write(b.buf); err != nil {
		b.err = err
	}
	b.buf = b.buf[:0]
}

// run writes the buffer out every interval until ctx is done, then once
// more.
func (b *lineBuffer) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = b.Sync()
			return
		case <-t.C:
			_ = b.Sync()
		}
	}
}

// flushCore writes an entry of level warn or above out at once, with
// whatever was buffered before it: an operator tailing the log sees a
// warning when it happens, access lines within the flush interval.
type flushCore struct {
	zapcore.Core
	buf *lineBuffer
}

func (c *flushCore) With(fields []zapcore.Field) zapcore.Core {
	return &flushCore{Core: c.Core.With(fields), buf: c.buf}
}

// Check adds c itself, a pointer: a flushCore value would be copied into
// an interface, an allocation per entry.
func (c *flushCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *flushCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	err := c.Core.Write(e, fields)
	if e.Level >= zapcore.WarnLevel {
		if serr := c.buf.Sync(); err == nil {
			err = serr
		}
	}
	return err
}
