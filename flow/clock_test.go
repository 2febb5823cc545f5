package flow

import (
	"sync"
	"time"
)

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	// Off a millisecond boundary, so that the Limiter's own epoch is too.
	return &fakeClock{t: time.Date(2025, 3, 1, 12, 0, 0, 123456, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
