package router

import (
	"sync"

	"github.com/kvroute/kvroute/oai"
)

// Tokenizer renders a parsed request to its routing key.
type Tokenizer interface {
	// AppendBlocks appends the block key of req to dst (one value per
	// whole block of the prompt's tokens, a chained hash that starts from
	// the model) and returns it with the prompt's length in tokens.
	AppendBlocks(dst []uint32, req *oai.Request) ([]uint32, int)
}

// Keyer prepares the router's view of a request, tokenizing the prompt when
// the router's current policy routes by prefix. It implements proxy.Keyer.
type Keyer struct {
	Tok    Tokenizer // nil: never a routing key
	Router *Router   // nil: always a key when Tok is set
}

// KeyUser is a policy that routes by the request's token key.
type KeyUser interface{ UsesKey() bool }

// Prepare fills dst from parsed and the session identity.
func (k Keyer) Prepare(parsed *oai.Request, session string, dst *Request) {
	*dst = Request{Kind: parsed.Kind, Model: parsed.Model, Stream: parsed.Stream, Session: session}
	if k.Tok == nil {
		return
	}
	if k.Router != nil {
		if ku, ok := k.Router.Policy().(KeyUser); !ok || !ku.UsesKey() {
			return
		}
	}
	bp, _ := keyPool.Get().(*[]uint32)
	if bp == nil {
		bp = new([]uint32)
	}
	dst.Key, dst.Tokens = k.Tok.AppendBlocks((*bp)[:0], parsed)
	dst.keyBuf = bp
}

// maxPooledKey is the capacity, in values, above which a key buffer is left
// to the garbage collector instead of being reused (256 KiB).
const maxPooledKey = 64 << 10

// keyPool holds key buffers between requests: allocating (and zeroing) one
// per request would cost more than most of the decision.
var keyPool sync.Pool

// Release returns req's key buffer for reuse by a later Prepare. The caller
// must be done with req.Key and everything that may still read it (the
// decision's undo included); req.Key is cleared.
func (k Keyer) Release(req *Request) {
	if bp := req.keyBuf; bp != nil && cap(req.Key) <= maxPooledKey {
		*bp = req.Key[:0] // AppendBlocks may have grown it
		keyPool.Put(bp)
	}
	req.Key, req.Tokens, req.keyBuf = nil, 0, nil
}
