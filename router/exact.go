package router

import (
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/tokenize"
)

// Exact gives a request's exact routing key, from the engine's own prompt
// tokens (precise mode): the key the engines' KV events are recorded under
// in the Index.
type Exact interface {
	// ExactKey appends to dst the exact key of the request of kind with
	// body, keyed under name (its model and cache salt,
	// tokenize.SaltedName, as the engines' events are), and returns it
	// with the prompt's length in tokens; ok is false when there is none
	// in time (the request routes on the approximate key alone).
	ExactKey(dst []uint32, kind oai.Kind, name string, body []byte) (key []uint32, tokens int, ok bool)
}

// exactBox holds an Exact for an atomic pointer.
type exactBox struct{ e Exact }

// SetExact makes Prepare fill each request's exact key from e (nil: none),
// when the policy in force routes by prefix.
func (r *Router) SetExact(e Exact) {
	if e == nil {
		r.exact.Store(nil)
		return
	}
	r.exact.Store(&exactBox{e})
}

// prepareExact fills dst's exact key from the Exact in force, if any,
// keyed under the model and salt.
func (r *Router) prepareExact(dst *Request, kind oai.Kind, salt string, body []byte) {
	b := r.exact.Load()
	if b == nil {
		return
	}
	kb := getKeyBuffer()
	key, tokens, ok := b.e.ExactKey(kb.vals[:0], kind, tokenize.SaltedName(dst.Model, salt), body)
	kb.vals = key
	if !ok || len(key) == 0 {
		putKeyBuffer(kb)
		return
	}
	dst.Exact, dst.exactBuf = key, kb
	if tokens > 0 {
		dst.ExactTokens = tokens
	}
}
