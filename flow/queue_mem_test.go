package flow

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/race"
)

// TestQueueMemory measures what a waiting request costs the queue: its
// Item, its wait (channel, timer, the waiting goroutine's stack) and its
// flow's share; docs/memory.md allows 8 KiB per entry, the proxy's client
// watch included (a goroutine of its own, measured here as a second
// waiting goroutine), and the waiting goroutine, which in kvroute is the
// request's handler, counted with its connection there.
func TestQueueMemory(t *testing.T) {
	const n = 2000
	q := NewQueue(QueueLimits{MaxQueued: n, MaxQueuedBytes: 1 << 40, MaxWait: time.Hour}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan error, n)
	watch := make(chan struct{})
	for i := range n {
		it := &Item{Priority: i % 3, Flow: fmt.Sprintf("tenant-%04d", i%500), Bytes: 1024}
		if err := q.Push(it); err != nil {
			t.Fatal(err)
		}
		go func() { done <- q.Wait(ctx, it) }()
		go func() { <-watch }() // more than the proxy's client watch costs (an entry of one watcher's set): an upper bound
	}
	if got, _ := q.Len(); got != n {
		t.Fatalf("%d queued, want %d", got, n)
	}
	time.Sleep(50 * time.Millisecond) // every goroutine parked
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc+after.StackInuse) - int64(before.HeapAlloc+before.StackInuse)
	per := grown / n
	t.Logf("%d queued: %d bytes each, the waiting goroutines' stacks included", n, per)
	if per > 8<<10 && !race.Enabled { // the race detector's stacks are larger
		t.Errorf("%d bytes per queued request, want at most 8 KiB (docs/memory.md)", per)
	}
	close(watch)
	cancel()
	for range n {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want context.Canceled", err)
		}
	}
}
