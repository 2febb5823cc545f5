// Package tokenize turns a parsed request into its routing key. Key gives
// the token sequence of its prompt, rendered in the order a chat template
// would render it (tools, then each message's role and content), so that a
// request whose prompt extends an earlier one gets a key that extends the
// earlier key. AppendBlocks gives what the router uses: the block key, one
// chained hash per whole block of those tokens (Options.KeyBlock tokens, the
// engines' KV-cache block), a sixteenth of the length at the default.
//
// Text is tokenized with the vocabulary of tiktoken's cl100k_base or
// o200k_base, read from the BPE files embedded in
// github.com/pkoukk/tiktoken-go-loader (nothing is downloaded), by a fast
// encoder of this package that produces exactly the token IDs of
// github.com/pkoukk/tiktoken-go's EncodeOrdinary. Special-token strings such
// as "<|endoftext|>" are tokenized as ordinary text.
//
// The encoder (pretok.go, bpe.go) replaces tiktoken-go's regexp2
// pre-tokenizer with hand-written scanners and its map-based merge with
// table lookups, for over 10x its speed. It matched tiktoken-go on every
// input tested: a 1.2 MB corpus of Go source, docs, JSON and generated
// non-ASCII text, and FuzzEncodeMatchesTiktoken. Invalid UTF-8 is handled as
// tiktoken-go handles it: each invalid byte becomes U+FFFD. No class of input
// falls back to tiktoken-go, which the tests use as the reference.
//
// A text longer than Options.ChunkBytes is cut into chunks, each encoded on
// its own, so near a cut its tokens can differ slightly from those of the
// whole text. The cuts depend only on the text, so a text that extends
// another keeps all of the other's tokens but those of its last chunk.
//
// Tokens are cached per message and per chunk of long texts, so a long
// system prompt or shared document is not tokenized again, and block keys
// per conversation turn: the next turn, which repeats a turn's tools and
// messages and adds a few, finds that turn's blocks in one lookup and one
// copy, and tokenizes and hashes only the new messages.
//
// A Tokenizer is safe for concurrent use. Keys and block keys depend only on
// the request (not on the cache state, nor on the process).
package tokenize

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"unicode/utf8"

	"github.com/kvroute/kvroute/oai"
)

// Synthetic token values. Real token IDs are below 1<<18; every value a key
// carries at or above FirstSynthetic stands for structure, not text.
const (
	// FirstSynthetic is the smallest synthetic value.
	FirstSynthetic uint32 = 0x8000_0000
	// Role markers are FirstSynthetic | a 28-bit hash of the role name; one
	// starts every message.
	roleMask uint32 = 0x0FFF_FFFF
	// MarkerEnd ends every message and the tool definitions.
	MarkerEnd uint32 = 0x9000_0000
	// MarkerTools starts the tool definitions.
	MarkerTools uint32 = 0x9000_0001
	// MarkerSep separates the items of a list prompt.
	MarkerSep uint32 = 0x9000_0002
	// A non-text part is two values at or above hashBase, each carrying 30
	// bits of the part's 64-bit hash (all 64 bits are folded in).
	hashBase uint32 = 0xC000_0000
	hashMask uint32 = 0x3FFF_FFFF
)

// Defaults and limits of Options.
const (
	DefaultCacheBytes = 64 << 20 // Options.CacheBytes when zero
	DefaultChunkBytes = 2048     // Options.ChunkBytes when zero
	MinChunkBytes     = 64       // smallest accepted Options.ChunkBytes
)

// Options configures a Tokenizer. The zero value is valid.
type Options struct {
	// Encoding is "cl100k_base" (the default when empty) or "o200k_base";
	// anything else is an error.
	Encoding string
	// CacheBytes bounds the estimated memory of the token cache, in bytes,
	// shared by its entries of messages, chunks and conversation turns.
	// 0 means DefaultCacheBytes (64 MiB); a negative value disables caching.
	CacheBytes int64
	// ChunkBytes is the approximate size, in bytes, of the chunks long texts
	// are cut into before tokenizing. Cuts are made at line breaks or spaces
	// where possible and depend only on the text. 0 means DefaultChunkBytes
	// (2048); other values below MinChunkBytes are an error.
	ChunkBytes int
	// KeyBlock is the number of tokens each value of a block key stands
	// for (see AppendBlocks): the engines' KV-cache block size. 0 means
	// DefaultKeyBlock (16); a negative value is an error.
	KeyBlock int
}

// Tokenizer renders requests into routing keys. It is safe for concurrent
// use; the slices it returns belong to the caller.
type Tokenizer struct {
	v     *vocab
	chunk int
	block int         // tokens per value of a block key
	cache *tokenCache // nil when caching is disabled
	seed  maphash.Seed
	// convBack is how many messages before the last one the latest
	// conversation hit ended (0: an exact repeat), the first boundary the
	// next request probes: most turns of a workload add the same number of
	// messages, so one probe usually finds the entry.
	convBack atomic.Int32
}

// New returns a Tokenizer for opts. The first Tokenizer of each encoding in
// a process builds its vocabulary tables (a few hundred milliseconds; about
// 10 MB for cl100k_base, 21 MB for o200k_base); later ones share them.
func New(opts Options) (*Tokenizer, error) {
	name := opts.Encoding
	if name == "" {
		name = EncodingCL100K
	}
	chunk := opts.ChunkBytes
	switch {
	case chunk == 0:
		chunk = DefaultChunkBytes
	case chunk < MinChunkBytes:
		return nil, fmt.Errorf("tokenize: ChunkBytes %d is below the minimum %d", chunk, MinChunkBytes)
	}
	block := opts.KeyBlock
	switch {
	case block == 0:
		block = DefaultKeyBlock
	case block < 0:
		return nil, fmt.Errorf("tokenize: KeyBlock %d is negative", block)
	}
	initClasses()
	v, err := loadVocab(name)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{
		v:     v,
		chunk: chunk,
		block: block,
		seed:  maphash.MakeSeed(),
	}
	cacheBytes := opts.CacheBytes
	if cacheBytes == 0 {
		cacheBytes = DefaultCacheBytes
	}
	if cacheBytes > 0 {
		t.cache = newTokenCache(cacheBytes)
	}
	return t, nil
}

// Encoding returns the name of the tokenizer's encoding.
func (t *Tokenizer) Encoding() string { return t.v.name }

// Key appends to dst[:0] the token sequence of the canonical rendering of req
// and returns it:
//
//	MarkerTools, tokens(req.Tools), MarkerEnd             if req.Tools != ""
//	role(m.Role), content(m.Parts), MarkerEnd             for each message m
//	tokens(Texts[0]), MarkerSep, tokens(Texts[1]), ...    prompt texts
//	MarkerSep, Tokens[0], MarkerSep, Tokens[1], ...       prompt token lists
//
// where a text part contributes its tokens and any other part two synthetic
// values from its hash. A nil req gives an empty key.
func (t *Tokenizer) Key(dst []uint32, req *oai.Request) []uint32 {
	return t.AppendKey(dst[:0], req)
}

// AppendKey is Key appending to dst as given, so a caller can put its own
// leading tokens first and size dst once.
func (t *Tokenizer) AppendKey(dst []uint32, req *oai.Request) []uint32 {
	if req == nil {
		return dst
	}
	dst = t.appendChat(dst, req, 0, true)
	return t.appendPrompt(dst, req)
}

// appendPrompt appends the prompt texts and token lists of req.
func (t *Tokenizer) appendPrompt(dst []uint32, req *oai.Request) []uint32 {
	w := blockWriter{t: t, toks: dst}
	w.prompt(req)
	return w.toks
}

// Encode appends to dst[:0] the tokens of text and returns them. Long texts
// are cut into chunks (see Options.ChunkBytes) encoded separately and cached.
func (t *Tokenizer) Encode(dst []uint32, text string) []uint32 {
	return t.appendText(dst[:0], text, true)
}

// CacheStats reports the token cache's counters by kind of entry. All are
// zero when caching is disabled.
type CacheStats struct {
	Messages      CacheCounters // tokens of whole messages and tool definitions
	Chunks        CacheCounters // tokens of chunks of long texts and of Encode texts
	Conversations CacheCounters // block keys of chat requests of two or more messages
}

// Stats returns the current cache counters.
func (t *Tokenizer) Stats() CacheStats {
	c := t.cache.counters()
	return CacheStats{Messages: c[kindMessage], Chunks: c[kindChunk], Conversations: c[kindConversation]}
}

// roleMarker returns the synthetic value that starts a message of role.
func roleMarker(role string) uint32 {
	// FNV-1a, 32 bits.
	h := uint32(2166136261)
	for i := 0; i < len(role); i++ {
		h ^= uint32(role[i])
		h *= 16777619
	}
	return FirstSynthetic | h&roleMask
}

// appendHash appends the two synthetic values of a non-text part's hash.
func appendHash(dst []uint32, h uint64) []uint32 {
	hi := uint32(h>>34) & hashMask
	lo := (uint32(h>>4) ^ uint32(h&0xF)<<26) & hashMask
	return append(dst, hashBase|hi, hashBase|lo)
}

// Domain bytes keep the message cache's kinds of entry apart.
const (
	domainMessage = 'm'
	domainTools   = 't'
	domainRaw     = 'r' // a message's JSON, in conversation keys only
)

func (t *Tokenizer) messageKey(m *oai.Message) key128 {
	var h maphash.Hash
	h.SetSeed(t.seed)
	n := writeMessage(&h, m)
	return key128{h.Sum64(), n}
}

// writeMessage feeds an unambiguous encoding of m to h (every
// variable-length field is preceded by its length) and returns the number
// of bytes it fed.
func writeMessage(h *maphash.Hash, m *oai.Message) uint64 {
	var buf [9]byte
	buf[0] = domainMessage
	binary.LittleEndian.PutUint64(buf[1:], uint64(len(m.Role)))
	h.Write(buf[:])
	h.WriteString(m.Role)
	n := uint64(len(buf) + len(m.Role))
	for i := range m.Parts {
		p := &m.Parts[i]
		if p.IsText {
			buf[0] = 'T'
			binary.LittleEndian.PutUint64(buf[1:], uint64(len(p.Text)))
			h.Write(buf[:])
			h.WriteString(p.Text)
			n += uint64(len(buf) + len(p.Text))
		} else {
			buf[0] = 'H'
			binary.LittleEndian.PutUint64(buf[1:], p.Hash)
			h.Write(buf[:])
			n += uint64(len(buf))
		}
	}
	return n
}

// writeChained feeds m to a conversation's hash: its JSON as written when
// it has one (hashing the raw bytes is cheaper than walking the parts, and
// within one Kind the raw text determines the message), else its parts as
// writeMessage does. It returns the number of bytes it stands for.
func writeChained(h *maphash.Hash, seed maphash.Seed, m *oai.Message) uint64 {
	if m.Raw == "" {
		return writeMessage(h, m)
	}
	return writeDigest(h, seed, domainRaw, m.Raw)
}

// writeTools feeds the tool definitions to a conversation's hash and
// returns the number of bytes they stand for.
func writeTools(h *maphash.Hash, seed maphash.Seed, tools string) uint64 {
	return writeDigest(h, seed, domainTools, tools)
}

// writeDigest feeds h the domain byte, the length and the one-shot hash of
// s under seed. Written to h itself, s would be copied through h's 128-byte
// buffer, which the short header leaves part full.
func writeDigest(h *maphash.Hash, seed maphash.Seed, domain byte, s string) uint64 {
	var buf [17]byte
	buf[0] = domain
	binary.LittleEndian.PutUint64(buf[1:], uint64(len(s)))
	binary.LittleEndian.PutUint64(buf[9:], maphash.String(seed, s))
	h.Write(buf[:])
	return uint64(9 + len(s))
}

func (t *Tokenizer) stringKey(domain byte, s string) key128 {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteByte(domain)
	h.WriteString(s)
	return key128{h.Sum64(), uint64(domain)<<56 | uint64(len(s))}
}

// appendChat appends the tools and messages of req from messages[from:]
// on (the tools only from 0), each through the message cache when cached.
func (t *Tokenizer) appendChat(dst []uint32, req *oai.Request, from int, cached bool) []uint32 {
	if from == 0 && req.Tools != "" {
		dst = t.appendTools(dst, req.Tools)
	}
	for i := from; i < len(req.Messages); i++ {
		dst = t.appendMessage(dst, &req.Messages[i], cached)
	}
	return dst
}

// appendMessage appends role marker, content and end marker of m, through
// the message cache when cached (and there is one).
func (t *Tokenizer) appendMessage(dst []uint32, m *oai.Message, cached bool) []uint32 {
	cached = cached && t.cache != nil && !cheap(m)
	var k key128
	if cached {
		k = t.messageKey(m)
		var ok bool
		if dst, ok = t.cache.get(dst, kindMessage, k); ok {
			return dst
		}
	}
	start := len(dst)
	dst = append(dst, roleMarker(m.Role))
	for i := range m.Parts {
		p := &m.Parts[i]
		if p.IsText {
			dst = t.appendText(dst, p.Text, false)
		} else {
			dst = appendHash(dst, p.Hash)
		}
	}
	dst = append(dst, MarkerEnd)
	if cached {
		t.cache.put(kindMessage, k, dst[start:])
	}
	return dst
}

// minCachedText is the text size, in bytes, from which a message goes
// through the message cache. A shorter one costs less to tokenize than a
// cache lookup and store (about 1.4 µs for a miss, 0.6 µs for a hit,
// against 0.3 µs to tokenize 60 bytes; BenchmarkRoutingSmall).
const minCachedText = 128

// cheap reports whether m's text is shorter than minCachedText.
func cheap(m *oai.Message) bool { return textBytes(m) < minCachedText }

// textBytes is the size of m's text parts.
func textBytes(m *oai.Message) int {
	n := 0
	for i := range m.Parts {
		n += len(m.Parts[i].Text)
	}
	return n
}

// appendTools appends the rendering of the tool definitions, through the
// message cache.
func (t *Tokenizer) appendTools(dst []uint32, tools string) []uint32 {
	var k key128
	if t.cache != nil {
		k = t.stringKey(domainTools, tools)
		var ok bool
		if dst, ok = t.cache.get(dst, kindMessage, k); ok {
			return dst
		}
	}
	start := len(dst)
	dst = append(dst, MarkerTools)
	dst = t.appendText(dst, tools, false)
	dst = append(dst, MarkerEnd)
	if t.cache != nil {
		t.cache.put(kindMessage, k, dst[start:])
	}
	return dst
}

// appendText appends the tokens of text, chunk by chunk. Chunks are cached
// when the text has more than one, or when cacheWhole is set (a text whose
// tokens no other cache holds).
func (t *Tokenizer) appendText(dst []uint32, text string, cacheWhole bool) []uint32 {
	w := blockWriter{t: t, toks: dst}
	w.text(text, cacheWhole)
	return w.toks
}

// appendChunk appends the tokens of c, a chunk of a valid text, through
// the chunk cache when cache is set (and there is one).
func (t *Tokenizer) appendChunk(dst []uint32, c string, cache bool) []uint32 {
	if t.cache == nil || !cache {
		return t.v.appendValid(dst, c)
	}
	k := t.stringKey('c', c)
	if out, ok := t.cache.get(dst, kindChunk, k); ok {
		return out
	}
	n := len(dst)
	dst = t.v.appendValid(dst, c)
	t.cache.put(kindChunk, k, dst[n:])
	return dst
}

// chunkEnd returns the end of the chunk of s that starts at i: all of the
// rest when it is at most size bytes, else the last cut in the second half of
// the next size bytes, preferring (1) just after a line break and before a
// non-space, then (2) just before a single space that starts a word, then
// (3) the last rune boundary. The cut depends only on s[i:i+size+2].
func chunkEnd(s string, i, size int) int {
	if len(s)-i <= size {
		return len(s)
	}
	limit := i + size // < len(s)
	space := -1
	for p := limit; p > i+size/2; p-- {
		prev := s[p-1]
		if prev == '\n' && !asciiSpace(s[p]) {
			return p
		}
		if space < 0 && s[p] == ' ' && !asciiSpace(prev) && p+1 < len(s) && !asciiSpace(s[p+1]) {
			space = p
		}
	}
	if space >= 0 {
		return space
	}
	p := limit
	for p > i+1 && !utf8.RuneStart(s[p]) {
		p--
	}
	return p
}

func asciiSpace(b byte) bool {
	return b == ' ' || b == '\n' || b == '\r' || b == '\t' || b == '\v' || b == '\f'
}
