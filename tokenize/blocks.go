package tokenize

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"sync"

	"github.com/kvroute/kvroute/oai"
)

// DefaultKeyBlock is Options.KeyBlock when zero: vLLM's default block size.
const DefaultKeyBlock = 16

// AppendBlocks appends to dst the block key of req and returns it, with the
// number of tokens of req's key (the length of Key(nil, req)).
//
// The block key cuts Key(nil, req) into blocks of Options.KeyBlock tokens
// and gives each whole block one value: 32 bits folded from a chained
// 64-bit hash of req.Model and req.CacheSalt (SaltedName), of the block's
// tokens and of every block before it. So two keys agree on their first n
// values exactly when their prompts agree on their first n blocks, for the
// same model and salt (barring a collision, about one
// in 2^32 between two blocks at the same place; a routing key is a hint, so
// a collision can misplace a request, never change its answer). A last
// partial block has no value: engines cache whole blocks only.
//
// A key is a sixteenth of its prompt's length at the default block size,
// and so are the work and memory of matching and recording it.
//
// A chat request of two or more messages goes through the conversation
// cache, which holds the blocks of each turn it saw with the tokens after
// the last whole block. An exact repeat is one copy of the blocks.
// Otherwise the longest of the request's last convProbes+1 message prefixes
// held there (probed where the latest hit was first, then from the longest
// down) gives its blocks, and only the messages after it are rendered and
// hashed on from its tail: a new turn, a retry, a fork from an earlier turn
// or an edit of a recent message costs the new text, not the history. Those
// messages bypass the message cache, whose copies they would only churn;
// without a prefix held, every message goes through it. The result is
// stored under the whole request.
func (t *Tokenizer) AppendBlocks(dst []uint32, req *oai.Request) ([]uint32, int) {
	if req == nil {
		return dst, 0
	}
	sp := tokPool.Get().(*[]uint32)
	defer func() {
		if cap(*sp) <= maxPooledTokens {
			tokPool.Put(sp)
		}
	}()
	name := SaltedName(req.Model, req.CacheSalt)
	w := blockWriter{t: t, toks: (*sp)[:0], ch: chain{state: modelSeed(name), block: t.block}}
	base := len(dst)
	conv := t.cache != nil && len(req.Messages) >= 2
	var whole key128
	var prev []uint32 // the blocks of the prefix found
	var mine bool     // prev may be extended in place
	from := 0
	if conv {
		var tail *convTail
		whole, from, prev, tail, mine = t.findConversation(req, name)
		if from == len(req.Messages) {
			return append(dst, prev...), tail.tokens
		}
		if tail != nil {
			dst = append(dst, prev...)
			w.ch.state, w.ch.tokens = tail.chain, tail.tokens-len(tail.tail)
			w.toks = append(w.toks, tail.tail...)
		}
	}
	w.key = dst
	if from == 0 && req.Tools != "" {
		w.toks = t.appendTools(w.toks, req.Tools)
	}
	for i := from; i < len(req.Messages); i++ {
		w.message(&req.Messages[i], from == 0)
	}
	w.prompt(req)
	*sp = w.toks
	dst, rest := w.ch.appendBlocks(w.key, w.toks)
	tokens := w.ch.tokens + len(rest)
	if conv {
		if !mine {
			// Room to grow, as append would leave.
			prev = append(make([]uint32, 0, 2*(len(dst)-base)), prev...)
		}
		t.cache.putConversation(whole, append(prev, dst[base+len(prev):]...), w.ch.state, tokens, rest)
	}
	return dst, tokens
}

// Blocks is AppendBlocks appending to dst[:0].
func (t *Tokenizer) Blocks(dst []uint32, req *oai.Request) ([]uint32, int) {
	return t.AppendBlocks(dst[:0], req)
}

// KeyBlock returns the number of tokens each value of a block key stands for.
func (t *Tokenizer) KeyBlock() int { return t.block }

// tokPool holds the token buffers AppendBlocks renders prompts into.
var tokPool = sync.Pool{New: func() any { return new([]uint32) }}

// maxPooledTokens is the capacity above which a token buffer is left to the
// garbage collector instead of being reused (1 MiB).
const maxPooledTokens = 256 << 10

// convProbes is how many message boundaries before the last one a chat
// request looks up in the conversation cache: the previous turn of a
// conversation ends one message (a retry with an answer appended) to a few
// messages (an answer, tool calls and their results, a new question) before.
const convProbes = 8

// convKeyBit is set in the second word of conversation keys, whose other
// keys' second words (a length, or a domain byte and a length) never set.
const convKeyBit = 1 << 63

// findConversation looks req, keyed under name (its model and salt:
// SaltedName), up in the conversation cache. It returns the
// key of the whole request and the longest prefix of it found: from, the
// number of its messages, with its blocks and tail (which the caller must
// not modify, but may append to with mine; see tokenCache.extend), or from
// 0 and a nil tail when none is held. from equal to len(req.Messages) is
// an exact hit.
func (t *Tokenizer) findConversation(req *oai.Request, name string) (whole key128, from int, blocks []uint32, tail *convTail, mine bool) {
	n := len(req.Messages)
	// ring[i%len(ring)] is the key of the tools and messages[:i+1], for
	// the last len(ring) values of i.
	var ring [convProbes + 1]key128
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteByte(byte(req.Kind))
	fed := 1 + writeModel(&h, name)
	if req.Tools != "" {
		fed += writeTools(&h, t.seed, req.Tools)
	}
	for i := range req.Messages {
		fed += writeChained(&h, t.seed, &req.Messages[i])
		if i >= n-len(ring) {
			ring[i%len(ring)] = key128{h.Sum64(), fed | convKeyBit}
		}
	}
	whole = ring[(n-1)%len(ring)]
	// Probe the boundary of the latest hit first, then the others from the
	// longest prefix down.
	low := max(0, n-len(ring))
	hint := n - 1 - int(t.convBack.Load())
	if hint < low {
		hint = n - 1
	}
	for p := 0; p <= n-low; p++ {
		i := hint
		if p > 0 {
			if i = n - p; i == hint {
				continue
			}
		}
		var ok bool
		if i == n-1 {
			blocks, tail, ok = t.cache.find(kindConversation, whole)
		} else {
			blocks, tail, mine, ok = t.cache.extend(kindConversation, ring[i%len(ring)])
		}
		if ok {
			t.noteConvHit(n - 1 - i)
			return whole, i + 1, blocks, tail, mine
		}
	}
	return whole, 0, nil, nil, false
}

// writeModel feeds the model's name to a conversation's hash and returns
// the number of bytes it fed.
func writeModel(h *maphash.Hash, model string) uint64 {
	var buf [9]byte
	buf[0] = 'M'
	binary.LittleEndian.PutUint64(buf[1:], uint64(len(model)))
	h.Write(buf[:])
	h.WriteString(model)
	return uint64(len(buf) + len(model))
}

// noteConvHit records how many messages before the last one a
// conversation hit ended, for the next request's first probe.
func (t *Tokenizer) noteConvHit(back int) {
	if int(t.convBack.Load()) != back {
		t.convBack.Store(int32(back))
	}
}

// chain hashes a token sequence block by block.
type chain struct {
	state  uint64 // after the last whole block
	tokens int    // tokens hashed into state
	block  int    // tokens per block
}

// appendBlocks hashes the whole blocks of toks into the chain, appending
// one value per block to dst, and returns dst and the tokens left over
// (fewer than a block).
func (c *chain) appendBlocks(dst, toks []uint32) (out, rest []uint32) {
	for len(toks) >= c.block {
		c.state = hashBlock(c.state, toks[:c.block])
		dst = append(dst, blockValue(c.state))
		toks = toks[c.block:]
		c.tokens += c.block
	}
	return dst, toks
}

// blockWriter renders a key's tokens into toks. With a chain (ch.block
// set), it hashes their whole blocks into key whenever hashEvery tokens
// have gathered, so toks holds about that many, or one cached message's,
// not the whole prompt's (a body of 100,000 short messages is 600,000
// tokens); without one, toks is the whole key.
type blockWriter struct {
	t    *Tokenizer
	ch   chain
	key  []uint32
	toks []uint32
}

// hashEvery is the number of tokens a blockWriter with a chain gathers
// before it hashes their whole blocks.
const hashEvery = 4096

// streamText is the text size, in bytes, from which a message bypasses
// the message cache (its chunks go through the chunk cache), so that its
// tokens are hashed chunk by chunk instead of held whole.
const streamText = 64 << 10

// hash hashes the whole blocks of toks, when hashEvery tokens have
// gathered, and moves the tokens left over to the start of toks.
func (w *blockWriter) hash() {
	if w.ch.block == 0 || len(w.toks) < hashEvery {
		return
	}
	var rest []uint32
	w.key, rest = w.ch.appendBlocks(w.key, w.toks)
	w.toks = w.toks[:copy(w.toks, rest)]
}

// message renders m: see Tokenizer.appendMessage, and streamText.
func (w *blockWriter) message(m *oai.Message, cached bool) {
	if textBytes(m) < streamText {
		w.toks = w.t.appendMessage(w.toks, m, cached)
		w.hash()
		return
	}
	w.toks = append(w.toks, roleMarker(m.Role))
	for i := range m.Parts {
		if p := &m.Parts[i]; p.IsText {
			w.text(p.Text, false)
		} else {
			w.toks = appendHash(w.toks, p.Hash)
		}
	}
	w.toks = append(w.toks, MarkerEnd)
	w.hash()
}

// text renders text chunk by chunk (see Tokenizer.appendText).
func (w *blockWriter) text(text string, cacheWhole bool) {
	text = validText(text)
	for i := 0; i < len(text); {
		j := chunkEnd(text, i, w.t.chunk)
		w.toks = w.t.appendChunk(w.toks, text[i:j], cacheWhole || j-i < len(text))
		i = j
		w.hash()
	}
}

// prompt renders the prompt texts and token lists of req.
func (w *blockWriter) prompt(req *oai.Request) {
	for i, s := range req.Prompt.Texts {
		if i > 0 {
			w.toks = append(w.toks, MarkerSep)
			w.hash()
		}
		w.text(s, true)
	}
	for i, toks := range req.Prompt.Tokens {
		if i > 0 || len(req.Prompt.Texts) > 0 {
			w.toks = append(w.toks, MarkerSep)
		}
		for len(toks) > 0 {
			n := min(len(toks), hashEvery)
			w.toks = append(w.toks, toks[:n]...)
			toks = toks[n:]
			w.hash()
		}
	}
}

// Multipliers of the block hash: odd 64-bit constants with well-mixed bits
// (those of SplitMix64 and of the golden ratio).
const (
	mulA = 0xbf58476d1ce4e5b9
	mulB = 0x94d049bb133111eb
	mulC = 0x9e3779b97f4a7c15
)

// hashBlock folds one block of tokens into the chain's state. Two lanes,
// each taking two tokens per step as one 64-bit word (multiply, then fold
// the high half down), keep the multiplier busy; a final mix joins them.
// Every step is a bijection of the lane's state for a given word, so
// distinct blocks collide only by chance.
func hashBlock(h uint64, b []uint32) uint64 {
	x, y := h, h^mulC
	i := 0
	for ; i+4 <= len(b); i += 4 {
		x = (x ^ (uint64(b[i]) | uint64(b[i+1])<<32)) * mulA
		x ^= x >> 32
		y = (y ^ (uint64(b[i+2]) | uint64(b[i+3])<<32)) * mulB
		y ^= y >> 32
	}
	for ; i < len(b); i++ {
		x = (x ^ uint64(b[i])) * mulA
		x ^= x >> 32
	}
	h = (x ^ bits.RotateLeft64(y, 29)) * mulC
	return h ^ h>>31
}

// blockValue is the key value of a block whose chain state is h.
func blockValue(h uint64) uint32 { return uint32(h ^ h>>32) }

// modelSeed starts the chain of a key for model, so that keys of different
// models (or adapters) share no values.
func modelSeed(model string) uint64 {
	// FNV-1a, 64 bits.
	h := uint64(14695981039346656037)
	for i := 0; i < len(model); i++ {
		h ^= uint64(model[i])
		h *= 1099511628211
	}
	return h
}
