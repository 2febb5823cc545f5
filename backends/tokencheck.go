package backends

import (
	"math/bits"
	"sync/atomic"
)

// tokenCheck holds, for the last tokenCheckWindow requests whose prompt a
// renderer tokenized whole (precise mode), whether its length agreed with
// the prompt_tokens the replica's engine reported. A renderer that
// tokenizes otherwise than the engine (another model's tokenizer or chat
// template) gives exact keys that none of the engine's KV events match,
// and its lengths differ: a silent failure this makes visible. One word:
// the low tokenCheckWindow bits are the history (1: disagreed, newest
// lowest), the bits above them the number of requests in it.
type tokenCheck struct{ v atomic.Uint64 }

// tokenCheckWindow is how many of the latest comparisons count, and
// tokenCheckMin how many are needed before a mismatch is called.
const (
	tokenCheckWindow = 32
	tokenCheckMin    = 8
)

// note adds one comparison.
func (c *tokenCheck) note(disagreed bool) {
	for {
		old := c.v.Load()
		hist, n := old&(1<<tokenCheckWindow-1), old>>tokenCheckWindow
		hist = hist << 1 & (1<<tokenCheckWindow - 1)
		if disagreed {
			hist |= 1
		}
		n = min(n+1, tokenCheckWindow)
		if c.v.CompareAndSwap(old, n<<tokenCheckWindow|hist) {
			return
		}
	}
}

// mismatch reports whether most of at least tokenCheckMin latest
// comparisons disagreed.
func (c *tokenCheck) mismatch() bool {
	v := c.v.Load()
	n := int(v >> tokenCheckWindow)
	return n >= tokenCheckMin && 2*bits.OnesCount64(v&(1<<tokenCheckWindow-1)) > n
}

// NoteTokenCounts records that a request whose prompt was rendered
// rendered tokens long (kvroute's exact key, precise mode) was reported
// by the replica's engine as reported prompt tokens long. Counts of 0
// (none known) are not compared.
func (r *Replica) NoteTokenCounts(rendered, reported int) {
	if rendered <= 0 || reported <= 0 {
		return
	}
	r.tokens.note(rendered != reported)
}

// TokenizerMismatch reports whether the prompt lengths kvroute's renderer
// gave for the replica's latest requests mostly differ from those its
// engine reported (NoteTokenCounts): the renderer tokenizes otherwise than
// the engine, and exact keys would not match its KV events.
func (r *Replica) TokenizerMismatch() bool { return r.tokens.mismatch() }
