package router

import (
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/oai"
)

// Tokenizer renders a parsed request to its routing key.
type Tokenizer interface {
	// AppendBlocks appends the block key of req to dst (one value per
	// whole block of the prompt's tokens, a chained hash that starts from
	// the model and cache salt) and returns it with the prompt's length in
	// tokens.
	AppendBlocks(dst []uint32, req *oai.Request) ([]uint32, int)
}

// Tokenizer returns the tokenizer of routing keys, or nil.
func (r *Router) Tokenizer() Tokenizer { return r.tok }

// Prepare is the one routing path's first half, for every caller: the
// proxy, /debug/route and the benchmarks. It parses body as a request of
// kind into bufs, takes the session identity (sessionHeader when not
// empty, else the body's OpenAI user field) and fills dst: model, stream
// flag, session, the stored response the request continues, and, when the
// policy in force routes by prefix and the Router has a tokenizer, the
// routing key. Route or Explain take dst next; Release gives back its key
// buffer once the request and its decisions are done. The parsed request
// and dst's strings alias body and bufs until then.
func (r *Router) Prepare(bufs *oai.Buffers, kind oai.Kind, body, sessionHeader []byte, dst *Request) (*oai.Request, error) {
	return r.prepare(bufs, kind, body, sessionHeader, dst, true)
}

// PrepareToExplain is Prepare for a request that Explain takes next
// (/debug/route), changing nothing: it gets no exact key, since the Exact
// in force renders the prompt, which writes the renderer's cache and
// counters (a failed render turns precise mode off, a kept one serves the
// conversation's next turn). Replicas whose entries follow their engines'
// events are then scored on the approximate key, as when a render fails.
func (r *Router) PrepareToExplain(bufs *oai.Buffers, kind oai.Kind, body, sessionHeader []byte, dst *Request) error {
	_, err := r.prepare(bufs, kind, body, sessionHeader, dst, false)
	return err
}

// prepare is Prepare, filling the exact key only with exact.
func (r *Router) prepare(bufs *oai.Buffers, kind oai.Kind, body, sessionHeader []byte, dst *Request, exact bool) (*oai.Request, error) {
	parsed, err := bufs.Parse(kind, body)
	if err != nil {
		*dst = Request{}
		return nil, err
	}
	session := parsed.User
	if len(sessionHeader) > 0 {
		session = string(sessionHeader)
	}
	*dst = Request{Kind: parsed.Kind, Model: parsed.Model, Stream: parsed.Stream, Session: session, ResponseID: parsed.PreviousResponseID}
	if r.tok == nil {
		return parsed, nil
	}
	if ku, ok := r.Policy().(KeyUser); !ok || !ku.UsesKey() {
		return parsed, nil
	}
	kb := getKeyBuffer()
	dst.Key, dst.Tokens = r.tok.AppendBlocks(kb.vals[:0], parsed)
	kb.vals = dst.Key // AppendBlocks may have grown it
	dst.keyBuf = kb
	if exact {
		r.prepareExact(dst, kind, parsed.CacheSalt, body)
	}
	return parsed, nil
}

// getKeyBuffer takes a key buffer from the pool.
func getKeyBuffer() *keyBuffer {
	if kb, _ := keyPool.Get().(*keyBuffer); kb != nil {
		return kb
	}
	return new(keyBuffer)
}

// putKeyBuffer returns kb to the pool, its keys no longer valid.
func putKeyBuffer(kb *keyBuffer) {
	kb.gen.Add(1)
	if cap(kb.vals) <= maxPooledKey {
		keyPool.Put(kb)
	}
}

// keyBuffer is a pooled routing-key buffer. gen counts its returns to the
// pool, so that a placement made with its key (index.RouterWriter.PlaceOwned)
// can tell whether the key still holds the values it was made with.
type keyBuffer struct {
	vals []uint32
	gen  atomic.Uint64
}

// owner is kb's generation counter, as index.RouterWriter.PlaceOwned
// takes it; nil for no buffer.
func (kb *keyBuffer) owner() *atomic.Uint64 {
	if kb == nil {
		return nil
	}
	return &kb.gen
}

// maxPooledKey is the capacity, in values, above which a key buffer is left
// to the garbage collector instead of being reused (256 KiB).
const maxPooledKey = 64 << 10

// keyPool holds key buffers between requests: allocating (and zeroing) one
// per request would cost more than most of the decision.
var keyPool sync.Pool

// Release returns req's key buffer for reuse by a later Prepare; req.Key is
// cleared. Decisions made for req no longer retract their Index entries
// after it (index.Placement.Retract).
func (r *Router) Release(req *Request) {
	if kb := req.keyBuf; kb != nil {
		kb.vals = req.Key[:0] // AppendBlocks may have grown it
		putKeyBuffer(kb)
	}
	if kb := req.exactBuf; kb != nil {
		kb.vals = req.Exact[:0]
		putKeyBuffer(kb)
	}
	req.Key, req.Tokens, req.keyBuf = nil, 0, nil
	req.Exact, req.ExactTokens, req.exactBuf = nil, 0, nil
}

// KeyHold keeps a request's routing key valid past Release, for the
// decisions that still use it: an answer streamed after the request's
// handler returned reports its cached tokens at the end (Decision.Feedback).
// Its zero value holds nothing.
type KeyHold struct{ kb, exact *keyBuffer }

// Hold takes req's key buffers out of the request: Release(req) then
// leaves them, and the decisions made for req keep their keys until Drop.
func (r *Router) Hold(req *Request) KeyHold {
	h := KeyHold{kb: req.keyBuf, exact: req.exactBuf}
	req.keyBuf, req.exactBuf = nil, nil
	return h
}

// Drop ends the hold: the key buffers go back to the pool. Safe on a zero
// KeyHold and more than once.
func (h *KeyHold) Drop() {
	if h.kb != nil {
		putKeyBuffer(h.kb)
	}
	if h.exact != nil {
		putKeyBuffer(h.exact)
	}
	h.kb, h.exact = nil, nil
}
