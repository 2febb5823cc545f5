// Package outcomes keeps the latest yes-or-no outcomes of something that
// happens often (a comparison, a call that was late or not), lock-free in
// one word, to say whether most of the recent ones went wrong.
package outcomes

import (
	"math/bits"
	"sync/atomic"
)

// Size is how many of the latest outcomes a Window keeps.
const Size = 32

// histMask selects a Window's history bits.
const histMask = 1<<Size - 1

// Window is the latest Size outcomes: the low Size bits of one word are
// the history (1: bad, newest lowest), the bits above them how many
// outcomes it holds. The zero Window holds none. Safe for concurrent use.
type Window struct{ v atomic.Uint64 }

// Note adds one outcome.
func (w *Window) Note(bad bool) {
	for {
		old := w.v.Load()
		hist, n := old<<1&histMask, min(old>>Size+1, Size)
		if bad {
			hist |= 1
		}
		if w.v.CompareAndSwap(old, n<<Size|hist) {
			return
		}
	}
}

// Mostly reports whether, of at least least outcomes held, more than half
// were bad.
func (w *Window) Mostly(least int) bool {
	v := w.v.Load()
	n := int(v >> Size)
	return n >= least && 2*bits.OnesCount64(v&histMask) > n
}

// Reset forgets every outcome.
func (w *Window) Reset() { w.v.Store(0) }
