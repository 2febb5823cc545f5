package router

import (
	"sync"

	"github.com/kvroute/kvroute/oai"
)

// Tokenizer renders a parsed request to its routing tokens.
type Tokenizer interface {
	// AppendKey appends the routing tokens of req to dst.
	AppendKey(dst []uint32, req *oai.Request) []uint32
}

// Keyer prepares the router's view of a request, tokenizing the prompt when
// the router's current policy routes by prefix. It implements proxy.Keyer.
type Keyer struct {
	Tok    Tokenizer // nil: never a routing key
	Router *Router   // nil: always a key when Tok is set
}

// KeyUser is a policy that routes by the request's token key.
type KeyUser interface{ UsesKey() bool }

// modelMarkBit sets the top bit of the leading token, above any vocabulary,
// so keys of different models never share a first token.
const modelMarkBit = 1 << 31

// ModelToken is the first token of every key for model: keys are kept per
// model, so equal prompts to different models or adapters never match.
func ModelToken(model string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(model); i++ {
		h ^= uint32(model[i])
		h *= 16777619
	}
	return h | modelMarkBit
}

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
	// Size the key once: about one token per 3 bytes of text, plus markers.
	est := 16 + len(parsed.Tools)/3
	for i := range parsed.Messages {
		est += 4
		for _, p := range parsed.Messages[i].Parts {
			est += 2 + len(p.Text)/3
		}
	}
	for _, s := range parsed.Prompt.Texts {
		est += 1 + len(s)/3
	}
	for _, toks := range parsed.Prompt.Tokens {
		est += 1 + len(toks)
	}
	bp, _ := keyPool.Get().(*[]uint32)
	if bp == nil {
		bp = new([]uint32)
	}
	if cap(*bp) < est {
		*bp = make([]uint32, 0, est)
	}
	key := append((*bp)[:0], ModelToken(parsed.Model))
	dst.Key = k.Tok.AppendKey(key, parsed)
	dst.keyBuf = bp
}

// maxPooledKey is the capacity, in tokens, above which a key buffer is left
// to the garbage collector instead of being reused (1 MiB).
const maxPooledKey = 256 << 10

// keyPool holds key buffers between requests: a key is as long as its
// prompt, so allocating (and zeroing) one per request would cost more than
// most of the decision.
var keyPool sync.Pool

// Release returns req's key buffer for reuse by a later Prepare. The caller
// must be done with req.Key and everything that may still read it (the
// decision's undo included); req.Key is cleared.
func (k Keyer) Release(req *Request) {
	if bp := req.keyBuf; bp != nil && cap(req.Key) <= maxPooledKey {
		*bp = req.Key[:0] // AppendKey may have grown it
		keyPool.Put(bp)
	}
	req.Key, req.keyBuf = nil, nil
}
