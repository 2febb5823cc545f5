// Package lograte limits warnings that a peer can cause at will (one per
// malformed message, one per forged id) to one line per reason per
// interval, with the count of those left out since the last line.
package lograte

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// DefaultEvery is the interval New uses when given 0: 10 s.
const DefaultEvery = 10 * time.Second

// maxReasons bounds the reasons tracked; reasons are fixed strings of the
// caller's code, so the bound is only a guard against a caller that builds
// them from what a peer sent. Past it, every reason beyond shares one slot.
const maxReasons = 256

// overflowReason is the slot shared by reasons past maxReasons.
const overflowReason = "other"

// Limiter writes at most one line per reason per interval. Safe for
// concurrent use; the zero value is not usable (New).
type Limiter struct {
	log   *zap.Logger
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	reasons map[string]*slot
}

type slot struct {
	last       time.Time // when the last line was written
	suppressed uint64    // left out since then
}

// New returns a Limiter writing to log (nil for none) at most one line per
// reason every every (0 for DefaultEvery).
func New(log *zap.Logger, every time.Duration) *Limiter {
	if log == nil {
		log = zap.NewNop()
	}
	if every <= 0 {
		every = DefaultEvery
	}
	return &Limiter{log: log, every: every, now: time.Now, reasons: make(map[string]*slot)}
}

// Warn logs msg at warning level with fields and a "reason" field, unless
// a line of the same reason was written less than the interval ago; a
// line written after some were left out carries their count
// ("suppressed"). It reports whether it wrote.
func (l *Limiter) Warn(reason, msg string, fields ...zap.Field) bool {
	n, ok := l.admit(reason)
	if !ok {
		return false
	}
	fields = append(fields, zap.String("reason", reason))
	if n > 0 {
		fields = append(fields, zap.Uint64("suppressed", n), zap.Duration("suppressed_over", l.every))
	}
	l.log.Warn(msg, fields...)
	return true
}

// admit reports whether reason may be written now and how many lines of
// it were left out since the last one.
func (l *Limiter) admit(reason string) (uint64, bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.reasons[reason]
	if s == nil {
		if len(l.reasons) >= maxReasons-1 { // one slot stays for overflowReason
			reason = overflowReason
			s = l.reasons[reason]
		}
		if s == nil {
			s = &slot{}
			l.reasons[reason] = s
			s.last = now
			return 0, true
		}
	}
	if now.Sub(s.last) < l.every {
		s.suppressed++
		return 0, false
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	return n, true
}
