package kvevents

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/internal/wait"
)

// rawPub is a hostile publisher on raw TCP: each connection gets the PUB
// handshake, then the next of its streams (the last one again once they
// run out). It reads and drops what the subscriber sends.
type rawPub struct {
	ln      net.Listener
	streams [][]byte
	mu      sync.Mutex
	n       int // connections accepted
	wg      sync.WaitGroup
}

func startRawPub(t testing.TB, streams ...[]byte) *rawPub {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPub{ln: ln, streams: streams}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.wg.Wait() })
	return p
}

func (p *rawPub) addr() string { return "tcp://" + p.ln.Addr().String() }

func (p *rawPub) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *rawPub) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		s := p.streams[min(p.n, len(p.streams)-1)]
		p.n++
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { _ = c.Close() }()
			go func() { _, _ = io.Copy(io.Discard, c) }()
			_, _ = c.Write(append(ZMTPHandshake("PUB"), s...))
			time.Sleep(200 * time.Millisecond) // let it be read before closing
		}()
	}
}

// goodMsg is a live message [topic, seq, payload] of one cleared event.
func goodMsg(t testing.TB, seq int64) []byte {
	t.Helper()
	p, err := Encode(Batch{TS: 1, Events: []Event{AllBlocksCleared{}}}, Tagged)
	if err != nil {
		t.Fatal(err)
	}
	return AppendZMTPMessage(nil, []byte("kv"), seqBytes(seq), p)
}

// A publisher that declares a frame, or a message, over MaxEventBytes, or
// sends bytes that are not ZMTP, has its connection closed before anything
// of the declared size is allocated, counted by reason. Without the guard
// the 1 TiB header ends the test binary (out of memory) and the others
// allocate what they declare.
func TestGuardRejects(t *testing.T) {
	const maxBytes = 1 << 20
	longBody := func(n int) []byte {
		return append(AppendZMTPHeader(nil, 0, uint64(n)), bytes.Repeat([]byte{'x'}, 64<<10)...)
	}
	tests := []struct {
		name   string
		stream []byte
		want   Reject
	}{
		{"frame of 1 TiB", AppendZMTPHeader(nil, 0, 1<<40), FrameTooLarge},
		{"frame of 2^63-1", AppendZMTPHeader(nil, flagMore, 1<<63-1), FrameTooLarge},
		{"streamed frame of 64 MiB", longBody(64 << 20), FrameTooLarge},
		{"message of three 400 KiB frames", AppendZMTPMessage(nil, make([]byte, 400<<10), make([]byte, 400<<10), make([]byte, 400<<10)), MessageTooLarge},
		{"command of 1 MiB", AppendZMTPHeader(nil, flagCommand, 1<<20), FrameTooLarge},
		{"reserved flag bits", []byte{0x80, 1, 'x'}, BadFraming},
		{"command inside a message", append(AppendZMTPHeader(nil, flagMore, 1), 'x', flagCommand, 0), BadFraming},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startRawPub(t, tc.stream)
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			s, _ := subscribe(t, nil, SubOptions{Endpoint: p.addr(), MaxEventBytes: maxBytes})
			wait.For(t, 5*time.Second, "the rejection", func() bool { return s.Status().Rejected[tc.want] > 0 })
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 16*maxBytes {
				t.Errorf("allocated %d bytes for a bound of %d", grew, maxBytes)
			}
			if got := s.Status().Rejected; got.Total() != got[tc.want] {
				t.Errorf("rejections %v, want only %s", got, tc.want)
			}
		})
	}
}

// After a rejection the subscription is not Live, though connected again,
// until a batch is delivered on a new connection.
func TestGuardLiveAfterRejection(t *testing.T) {
	huge := AppendZMTPHeader(nil, 0, 1<<40)
	p := startRawPub(t, append(goodMsg(t, 0), huge...), huge, goodMsg(t, 1))
	s, h := subscribe(t, nil, SubOptions{Endpoint: p.addr(), ReplayEndpoint: "-"})
	wait.For(t, 5*time.Second, "two rejections", func() bool { return s.Status().Rejected[FrameTooLarge] >= 2 })
	if p.accepted() < 3 {
		if st := s.Status(); st.Live {
			t.Errorf("live after rejections, before a good batch: %+v", st)
		}
	}
	wait.For(t, 5*time.Second, "live again after a good batch", func() bool { return s.Status().Live && s.Status().Batches >= 2 })
	if got := h.snapshot(); len(got) < 2 {
		t.Errorf("handler saw %v", got)
	}
}

// 20,000 garbage messages make a handful of warning lines, not one each.
func TestGarbageIsNotALogFlood(t *testing.T) {
	var garbage []byte
	for i := range 20000 {
		garbage = AppendZMTPMessage(garbage, []byte{byte(i)})
	}
	garbage = append(garbage, goodMsg(t, 0)...)
	p := startRawPub(t, garbage)
	core, logs := observer.New(zapcore.WarnLevel)
	h := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Subscribe(ctx, SubOptions{Endpoint: p.addr(), Handler: h, Logger: zap.New(core),
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); <-s.Done() }()
	wait.For(t, 10*time.Second, "the good batch after the garbage", func() bool { return s.Status().Batches >= 1 })
	if n := s.Status().Rejected[Malformed]; n < 20000 {
		t.Errorf("%d malformed messages counted, want 20000", n)
	}
	if n := logs.Len(); n > 10 {
		t.Errorf("%d warning lines for 20,000 garbage messages", n)
	}
}
