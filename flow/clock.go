package flow

import "time"

// Clock tells the time; tests pass a fake one.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real Clock.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }
