package lograte

import (
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// A flood of one reason writes one line per interval, the next line
// carrying the count left out; other reasons are limited apart.
func TestWarnLimitsPerReason(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	l := New(zap.New(core), 10*time.Second)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for range 100000 {
		l.Warn("malformed", "bad message")
	}
	l.Warn("gap", "gap")
	if got := logs.Len(); got != 2 {
		t.Fatalf("%d lines after 100,000 of one reason and one of another, want 2", got)
	}
	now = now.Add(9 * time.Second)
	if l.Warn("malformed", "bad message") {
		t.Fatal("wrote within the interval")
	}
	now = now.Add(time.Second)
	if !l.Warn("malformed", "bad message") {
		t.Fatal("did not write once the interval passed")
	}
	last := logs.All()[logs.Len()-1].ContextMap()
	if last["suppressed"] != uint64(100000) || last["reason"] != "malformed" {
		t.Fatalf("last line's fields %v, want suppressed 100000 and reason malformed", last)
	}
}

// Reasons built from a peer's bytes cannot grow the limiter past its bound.
func TestReasonsBounded(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	l := New(zap.New(core), time.Hour)
	for i := range 10 * maxReasons {
		l.Warn("r"+strconv.Itoa(i), "x")
	}
	if len(l.reasons) > maxReasons {
		t.Fatalf("%d reasons kept, bound %d", len(l.reasons), maxReasons)
	}
	if logs.Len() != maxReasons {
		t.Fatalf("%d lines, want %d (one per kept reason, the rest sharing one slot)", logs.Len(), maxReasons)
	}
}
