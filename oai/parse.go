package oai

import (
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Parse reads the routing fields of body for a request of kind k. It checks
// the shape of the fields routing needs and nothing else: every other field
// is left to the replica. A bad body yields an *Error with status 400.
//
// Parse reads body once, validating all of it as JSON (RFC 8259, nesting at
// most 300 levels, UTF-8) without building a tree: fields routing does not
// need are checked and skipped. The returned Request aliases body (see
// Request): it is valid only while body is unchanged.
//
// When a key occurs more than once in an object, its first occurrence is the
// one read (later ones are only checked to be valid JSON). Keys are compared
// unescaped, so "mod\u0065l" is "model". When the body has several problems,
// the error reported does not depend on the order of its fields: it is the
// first in the order model, stream, user, cache_salt, then the kind's own fields (tools
// or instructions, then messages, input or the prompt, then each message in
// order; within a message its role before its content).
func Parse(k Kind, body []byte) (*Request, error) {
	p := parser{scanner: scanner{b: body}, kind: k, req: &Request{Kind: k}}
	return p.run()
}

// Buffers keeps the memory of parsed requests for the next parse: the
// messages, their parts and the decoded strings. A Request returned by
// (*Buffers).Parse is valid until the next Parse on the same Buffers (and,
// as always, while its body is unchanged). The zero value is ready to use;
// a Buffers must not be used concurrently. Holding one per request in
// flight (in a sync.Pool) saves the allocations of a chat request's parse.
type Buffers struct {
	req     Request
	msgs    []Message
	parts   []Part
	arena   []byte
	scratch []byte
}

// maxKeptBytes bounds the memory a Buffers keeps from one parse to the
// next; a parse that needed more leaves it to the garbage collector.
const maxKeptBytes = 1 << 20

// Parse is Parse, reusing b's memory.
func (b *Buffers) Parse(k Kind, body []byte) (*Request, error) {
	b.req = Request{Kind: k}
	p := parser{scanner: scanner{b: body}, kind: k, req: &b.req,
		msgBuf: b.msgs[:0], parts: b.parts[:0], arena: b.arena[:0], scratch: b.scratch[:0]}
	req, err := p.run()
	b.msgs = keep(b.msgs, p.req.Messages)
	b.parts = keep(b.parts, p.parts)
	b.arena = keep(b.arena, p.arena)
	b.scratch = keep(b.scratch, p.scratch)
	return req, err
}

// keep returns the buffer to reuse after a parse that left used: used's
// array when it is no larger than maxKeptBytes, else the previous one. The
// elements are not cleared (they are the returned Request's until the next
// parse), so a kept buffer may hold on to strings of earlier bodies until
// they are overwritten.
func keep[T any](prev, used []T) []T {
	if uintptr(cap(used))*unsafe.Sizeof(*new(T)) > maxKeptBytes {
		return prev[:0]
	}
	return used[:0]
}

func (p *parser) run() (*Request, error) {
	body := p.b
	p.budget = builtPerByte*len(body) + builtSlack
	if len(body) == 0 {
		return nil, BadRequest("request body is empty; expected a JSON object", "")
	}
	var ok bool
	notObject := ""
	if c := p.peek(); c == '{' {
		ok = p.root()
	} else {
		notObject = typeName(c)
		ok = p.skip(0)
	}
	if ok {
		if p.ws(); p.i < len(body) {
			ok = p.fail("unexpected data after the top-level value")
		}
	}
	if !ok {
		if !utf8.Valid(body) {
			return nil, BadRequest("request body is not valid UTF-8", "")
		}
		return nil, BadRequest("request body is not valid JSON: "+shorten(p.synError()), "")
	}
	if notObject != "" {
		return nil, BadRequest("request body must be a JSON object, got "+notObject, "")
	}
	p.end()
	for _, e := range p.errs {
		if e != nil {
			return nil, e
		}
	}
	p.finish()
	return p.req, nil
}

// typeName names the JSON type of the value starting with c.
func typeName(c byte) string {
	switch c {
	case '[':
		return "array"
	case '"':
		return "string"
	case 't':
		return "true"
	case 'f':
		return "false"
	case 'n':
		return "null"
	}
	return "number"
}

// Error slots. A semantic error does not stop the scan (a later syntax error
// takes precedence, as when the whole body was decoded first); it fills its
// slot if empty, and the first filled slot is the error reported.
const (
	slotModel = iota
	slotStream
	slotUser
	slotSalt
	slotFirst // chat: tools; responses: instructions
	slotShape // chat: messages; responses: input; prompts
	slotItems // the first message (responses input item) with an error
	nSlots
)

// Top-level keys, as bits of parser.seen.
const (
	kModel = 1 << iota
	kStream
	kUser
	kTools
	kMessages
	kPrompt
	kInput
	kInstructions
	kPrevious
	kText
	kInputIDs
	kCacheSalt
	kPriority
)

// The generate endpoint's two prompt keys: the text, or its token ids.
const (
	keyText     = "text"
	keyInputIDs = "input_ids"
)

// keyCacheSalt is vLLM's request field that isolates the engine's prefix
// cache per salt.
const keyCacheSalt = "cache_salt"

// MaxCacheSaltBytes bounds a request's cache_salt, decoded: a longer one
// is refused with 400 (the salt starts the routing key's chain, and is
// never kept; see Request.CacheSalt).
const MaxCacheSaltBytes = 256

// saltTooLong is the error of a cache_salt over MaxCacheSaltBytes. It
// does not quote the salt.
func saltTooLong() *Error {
	return BadRequest("'"+keyCacheSalt+"' must be at most "+strconv.Itoa(MaxCacheSaltBytes)+" bytes", keyCacheSalt)
}

// Keys of a message, as bit numbers.
const (
	mRole = iota
	mName
	mContent
	mToolCalls // then function_call and tool_call_id, in this order
)

// parser reads the routing fields of one body.
type parser struct {
	scanner
	kind    Kind
	req     *Request
	errs    [nSlots]*Error
	seen    uint32    // top-level keys met: the first occurrence of a key wins
	msgBuf  []Message // empty; the messages are appended to it when not nil
	parts   []Part    // backing array of all messages' parts, in order
	arena   []byte    // backing of the strings Parse builds (unescaped, compacted)
	scratch []byte    // unescaped keys and content-part types; not retained

	instr    string // responses: instructions
	hasInstr bool
	hasInput bool        // responses: a non-null input
	prompt   promptState // completion prompt, embedding input, generate text
	ids      promptState // generate input_ids

	// built is the bytes of messages, parts, prompt texts and token ids
	// built so far; past budget, nothing more is (see over).
	built, budget int
	reserved      int  // bytes of capacity reserved ahead (within)
	capped        bool // a reservation was cut to fit the budget: see full

	// counting: a copy of the parser that counts the messages and parts
	// it would build (nMsgs, nParts) and builds nothing; see reserveItems.
	counting      bool
	nMsgs, nParts int
}

// promptState collects one prompt-shaped field.
type promptState struct {
	p       Prompt
	toks    []uint32 // backing array of all token lists, in order
	present bool     // the field is there and not null
	err     *Error
}

// Routing fields of a body of n bytes are built up to builtPerByte*n +
// builtSlack bytes (parser.budget). Real messages are built whole (a chat
// message of one short text costs about 2.5 times its JSON); bodies of
// thousands of empty parts, items or prompt strings, which would cost up
// to 30 times their size, are routed on their prompt's first part.
const (
	builtPerByte = 4
	builtSlack   = 64 << 10
)

// over reports whether the routing fields have passed their budget: the
// request is then Truncated, and the messages, parts, prompt texts and
// token ids after are checked as before but not kept.
func (p *parser) over() bool {
	if !p.req.Truncated && p.built > p.budget {
		p.req.Truncated = true
	}
	return p.req.Truncated
}

// addPart appends pt to the parts, within the budget.
func (p *parser) addPart(pt Part) {
	if p.counting {
		p.nParts++
		return
	}
	if p.over() || p.full(len(p.parts), cap(p.parts)) {
		return
	}
	p.built += int(unsafe.Sizeof(pt))
	p.parts = append(p.parts, pt)
}

// addText appends a prompt text, within the budget.
func (p *parser) addText(ps *promptState, text string) {
	if p.over() || p.full(len(ps.p.Texts), cap(ps.p.Texts)) {
		return
	}
	p.built += int(unsafe.Sizeof(text))
	ps.p.Texts = append(ps.p.Texts, text)
}

// itemFailed reports whether a message already failed: later messages'
// errors cannot be reported, so they are not built (a body of many bad
// messages costs no allocation per message).
func (p *parser) itemFailed() bool { return p.errs[slotItems] != nil }

func (p *parser) setErr(slot int, e *Error) {
	if p.errs[slot] == nil {
		p.errs[slot] = e
	}
}

// text returns the decoded contents of the string raw at b[s:e]: aliasing
// the body when it has no escape, else decoded into the arena.
func (p *parser) text(s, e int, esc bool) string {
	if p.counting {
		return ""
	}
	if !esc {
		if s == e {
			return ""
		}
		return unsafe.String(&p.b[s], e-s)
	}
	start := p.reserve(e - s)
	p.arena = appendUnescaped(p.arena, p.b[s:e])
	return p.arenaString(start)
}

// reserve makes room for n more bytes in the arena, never moving bytes
// already handed out, and returns where they will start.
func (p *parser) reserve(n int) int {
	if cap(p.arena)-len(p.arena) < n {
		size := max(2*cap(p.arena), 512)
		size = min(size, 64<<10)
		p.arena = make([]byte, 0, max(size, n))
	}
	return len(p.arena)
}

func (p *parser) arenaString(start int) string {
	if len(p.arena) == start {
		return ""
	}
	return unsafe.String(&p.arena[start], len(p.arena)-start)
}

// compactText returns the compact JSON text of the value at b[s:e]: the body
// itself when it has no whitespace outside strings (compact), else a copy
// without it.
func (p *parser) compactText(s, e int, compact bool) string {
	if compact || p.counting {
		return unsafe.String(&p.b[s], e-s)
	}
	start := p.reserve(e - s)
	p.arena = appendCompact(p.arena, p.b[s:e])
	return p.arenaString(start)
}

// fold scans the value at the current position, nested in depth containers,
// and returns its compact JSON text.
func (p *parser) fold(depth int) (string, bool) {
	p.peek()
	start, n := p.i, p.nws
	if !p.skip(depth) {
		return "", false
	}
	return p.compactText(start, p.i, p.nws == n), true
}

// member scans an object key and its colon and returns the key, unescaped.
// The key may live in p.scratch: it is valid until the next use of scratch.
func (p *parser) member() ([]byte, bool) {
	if p.peek() != '"' {
		return nil, p.fail("expected string object key")
	}
	s, e, esc, ok := p.str()
	if !ok {
		return nil, false
	}
	k := p.b[s:e]
	if esc {
		p.scratch = appendUnescaped(p.scratch[:0], k)
		k = p.scratch
	}
	return k, p.colon()
}

// root reads the top-level object at the current position.
func (p *parser) root() bool {
	more, ok := p.open('}'), true
	for ok && more {
		var k []byte
		if k, ok = p.member(); !ok {
			break
		}
		if ok = p.field(k); ok {
			more, ok = p.next('}')
		}
	}
	return ok
}

// field reads the value of the top-level key k.
func (p *parser) field(k []byte) bool {
	var bit uint32
	switch string(k) {
	case "model":
		bit = kModel
	case "stream":
		bit = kStream
	case "user":
		bit = kUser
	case "tools":
		bit = kTools
	case "messages":
		bit = kMessages
	case "prompt":
		bit = kPrompt
	case "input":
		bit = kInput
	case "instructions":
		bit = kInstructions
	case "previous_response_id":
		bit = kPrevious
	case keyText:
		bit = kText
	case keyInputIDs:
		bit = kInputIDs
	case keyCacheSalt:
		bit = kCacheSalt
	case "priority":
		bit = kPriority
	}
	if bit == 0 || p.seen&bit != 0 {
		return p.skip(1)
	}
	p.seen |= bit
	switch {
	case bit == kModel:
		return p.optString(&p.req.Model, slotModel, "'model' must be a string", "model")
	case bit == kUser:
		return p.optString(&p.req.User, slotUser, "'user' must be a string", "user")
	case bit == kCacheSalt:
		ok := p.optString(&p.req.CacheSalt, slotSalt, "'"+keyCacheSalt+"' must be a string", keyCacheSalt)
		if len(p.req.CacheSalt) > MaxCacheSaltBytes {
			p.req.CacheSalt = ""
			p.setErr(slotSalt, saltTooLong())
		}
		return ok
	case bit == kPriority:
		return p.priority()
	case bit == kStream:
		switch p.peek() {
		case 't':
			p.req.Stream = true
			return p.lit("true")
		case 'f':
			return p.lit("false")
		case 'n':
			return p.lit("null")
		}
		p.setErr(slotStream, BadRequest("'stream' must be a boolean", "stream"))
	case bit == kTools && p.kind == KindChat:
		switch p.peek() {
		case 'n':
			return p.lit("null")
		case '[':
			var ok bool
			p.req.Tools, ok = p.fold(1)
			return ok
		}
		p.setErr(slotFirst, BadRequest("'tools' must be an array", "tools"))
	case bit == kTools && p.kind == KindResponses:
		if p.peek() == '[' {
			var ok bool
			p.req.Tools, ok = p.fold(1)
			return ok
		}
	case bit == kMessages && p.kind == KindChat:
		return p.messages()
	case bit == kPrompt && p.kind == KindCompletion:
		return p.readPrompt(&p.prompt, "prompt")
	case bit == kInput && p.kind == KindEmbedding:
		return p.readPrompt(&p.prompt, "input")
	case bit == kText && p.kind == KindGenerate:
		return p.readPrompt(&p.prompt, keyText)
	case bit == kInputIDs && p.kind == KindGenerate:
		return p.readPrompt(&p.ids, keyInputIDs)
	case bit == kInput && p.kind == KindResponses:
		return p.input()
	case bit == kPrevious && p.kind == KindResponses:
		if p.peek() == '"' {
			s, e, esc, ok := p.str()
			if ok {
				p.req.PreviousResponseID = p.text(s, e, esc)
			}
			return ok
		}
	case bit == kInstructions && p.kind == KindResponses:
		switch p.peek() {
		case 'n':
			return p.lit("null")
		case '"':
			s, e, esc, ok := p.str()
			if ok {
				p.instr, p.hasInstr = p.text(s, e, esc), true
			}
			return ok
		}
		p.setErr(slotFirst, BadRequest("'instructions' must be a string", "instructions"))
	}
	return p.skip(1)
}

// optString reads a top-level field that must be a string or null.
func (p *parser) optString(dst *string, slot int, msg, param string) bool {
	switch p.peek() {
	case 'n':
		return p.lit("null")
	case '"':
		s, e, esc, ok := p.str()
		if ok {
			*dst = p.text(s, e, esc)
		}
		return ok
	}
	p.setErr(slot, BadRequest(msg, param))
	return p.skip(1)
}

// priority reads vLLM's priority field: an integer in 32 bits, lower
// served first. Any other value is left to the engine to judge, and
// kvroute reads none.
func (p *parser) priority() bool {
	c := p.peek()
	if c != '-' && (c < '0' || '9' < c) {
		return p.skip(1)
	}
	s := p.i
	if !p.num() {
		return false
	}
	if v, err := strconv.ParseInt(string(p.b[s:p.i]), 10, 32); err == nil {
		p.req.Priority, p.req.HasPriority = int(v), true
	}
	return true
}

// messages reads a chat request's messages.
func (p *parser) messages() bool {
	if p.peek() != '[' {
		p.setErr(slotShape, BadRequest("'messages' must be an array", "messages"))
		return p.skip(1)
	}
	more, ok := p.open(']'), true
	if !more {
		p.setErr(slotShape, BadRequest("'messages' must contain at least one message", "messages"))
	}
	return p.items(more, ok, false, "messages")
}

// items reads the elements of an array already opened (more, ok as open
// returned them): chat messages, or responses input items, each an object.
func (p *parser) items(more, ok, responses bool, param string) bool {
	for idx := 0; ok && more; idx++ {
		if idx == sizeAfter && !p.counting {
			p.reserveItems(responses, param)
		}
		if p.peek() == '{' {
			ok = p.message(2, idx, responses)
		} else {
			if !p.itemFailed() {
				p.setErr(slotItems, BadRequest(where(responses, idx)+" must be an object", param))
			}
			ok = p.skip(2)
		}
		if ok {
			more, ok = p.next(']')
		}
	}
	return ok
}

// sizeAfter is the number of items after which items counts the rest of
// its array, so that the messages and parts arrays are allocated once at
// their final size. Grown by append, by a quarter at a time past a few
// hundred elements, they would allocate about five times their final size
// in all and hold two and a quarter times it at the last copy: 50 MB for a
// body of 100,000 short messages (3.7 MB).
const sizeAfter = 128

// reserveItems makes room for the items left in the array at the current
// position (and for a responses request's instructions, which finish puts
// first): it counts the messages and parts they make with a copy of the
// parser that builds nothing (counting), and reserves as many, or, when
// they would pass the budget, the share of each that fits.
func (p *parser) reserveItems(responses bool, param string) {
	c := *p // shares p.req, which a counting parser never writes
	c.counting, c.nMsgs, c.nParts = true, 0, 0
	c.items(true, true, responses, param)
	msgs, parts := c.nMsgs+1, c.nParts+1
	size := msgs*int(unsafe.Sizeof(Message{})) + parts*int(unsafe.Sizeof(Part{}))
	if left := max(p.budget-p.built-p.reserved, 0); size > left {
		// Both in proportion; past them, the request is truncated (full).
		msgs, parts = msgs*(left>>10)/(size>>10+1)+1, parts*(left>>10)/(size>>10+1)+1
		size, p.capped = left, true
	}
	p.reserved += size
	if p.req.Messages == nil {
		p.req.Messages = p.msgBuf
	}
	p.req.Messages = withRoom(p.req.Messages, msgs)
	p.parts = withRoom(p.parts, parts)
}

// within returns n, or fewer: as many elements of size bytes as are left
// of the budget, less what earlier reservations took, and one more. It
// counts them as reserved.
func (p *parser) within(n int, size uintptr) int {
	if fit := max(p.budget-p.built-p.reserved, 0)/int(size) + 1; n > fit {
		n, p.capped = fit, true
	}
	p.reserved += n * int(size)
	return n
}

// full reports whether an array of length n and capacity c may not grow:
// a reservation was cut to fit the budget (capped) and c is reached. The
// request is then truncated.
func (p *parser) full(n, c int) bool {
	if p.capped && n == c {
		p.req.Truncated = true
	}
	return p.req.Truncated
}

// countRest counts the elements left in the array at the current position,
// nested in depth containers, with a scan of a copy of the scanner that
// builds nothing. On a syntax error it returns what it counted so far: the
// scan that reads the elements reports the error.
func (p *parser) countRest(depth int) int {
	c := p.scanner
	n := 0
	for more := true; more; {
		var ok bool
		if !c.skip(depth) {
			break
		}
		n++
		if more, ok = c.next(']'); !ok {
			break
		}
	}
	return n
}

// withRoom returns s with room for n more elements: s itself when it has
// it, else a copy in an array of exactly that size.
func withRoom[T any](s []T, n int) []T {
	if cap(s)-len(s) >= n {
		return s
	}
	return append(make([]T, 0, len(s)+n), s...)
}

// input reads a responses request's input: a string or input items.
func (p *parser) input() bool {
	switch p.peek() {
	case 'n':
		return p.lit("null")
	case '"':
		p.hasInput = true
		s, e, esc, ok := p.str()
		if ok {
			first := len(p.parts)
			p.addPart(Part{Text: p.text(s, e, esc), IsText: true})
			p.addMessage("user", first, unsafe.String(&p.b[s-1], e+1-(s-1)))
		}
		return ok
	case '[':
	default:
		p.hasInput = true
		p.setErr(slotShape, BadRequest("'input' must be a string or an array of input items", "input"))
		return p.skip(1)
	}
	p.hasInput = true
	more, ok := p.open(']'), true
	return p.items(more, ok, true, "input")
}

// where names message idx in errors.
func where(resp bool, idx int) string {
	if resp {
		return "input[" + strconv.Itoa(idx) + "]"
	}
	return "messages[" + strconv.Itoa(idx) + "]"
}

// addMessage appends a message whose parts are p.parts[first:]. Until
// finish, a message's Parts only records its length. Past the budget
// (over), the message and its parts are left out.
func (p *parser) addMessage(role string, first int, raw string) {
	if p.counting {
		p.nMsgs++
		return
	}
	if p.over() || p.full(len(p.req.Messages), cap(p.req.Messages)) {
		p.parts = p.parts[:first]
		return
	}
	p.built += int(unsafe.Sizeof(Message{}))
	if p.req.Messages == nil {
		p.req.Messages = p.msgBuf
		if p.req.Messages == nil {
			p.req.Messages = make([]Message, 0, 8)
		}
	}
	p.req.Messages = append(p.req.Messages, Message{Role: role, Parts: p.parts[first:], Raw: raw})
}

// message reads one chat message, or one responses input item (resp), at
// depth depth: its role and content, plus name and tool calls folded in as
// text so they shape the key. A responses item without a role is not a
// message: it shapes the key whole, as compact JSON.
func (p *parser) message(depth, idx int, resp bool) bool {
	start, nws := p.i, p.nws
	first := len(p.parts)
	if p.parts == nil {
		p.parts = make([]Part, 0, 16)
	}
	var (
		seen    uint8
		role    string
		roleOK  bool
		name    string
		hasName bool
		cerr    *Error // the first error in the content
		folds   [3]string
		hasFold [3]bool
	)
	more, ok := p.open('}'), true
	for ok && more {
		var k []byte
		if k, ok = p.member(); !ok {
			break
		}
		f := -1
		switch string(k) {
		case "role":
			f = mRole
		case "name":
			f = mName
		case "content":
			f = mContent
		case "tool_calls":
			f = mToolCalls
		case "function_call":
			f = mToolCalls + 1
		case "tool_call_id":
			f = mToolCalls + 2
		}
		switch {
		case f < 0 || seen&(1<<f) != 0:
			ok = p.skip(depth + 1)
		case f == mRole:
			seen |= 1 << f
			var s, e int
			var esc, isStr bool
			if s, e, esc, isStr, ok = p.strOrSkip(depth + 1); isStr {
				role, roleOK = p.text(s, e, esc), true
			}
		case f == mName:
			seen |= 1 << f
			var s, e int
			var esc, isStr bool
			if s, e, esc, isStr, ok = p.strOrSkip(depth + 1); isStr {
				name, hasName = p.prefixed("name:", s, e, esc), true
			}
		case f == mContent:
			seen |= 1 << f
			ok = p.content(depth+1, idx, resp, &cerr)
		default: // tool_calls, function_call, tool_call_id
			seen |= 1 << f
			if p.peek() == 'n' {
				ok = p.lit("null")
				break
			}
			folds[f-mToolCalls], ok = p.fold(depth + 1)
			hasFold[f-mToolCalls] = true
		}
		if ok {
			more, ok = p.next('}')
		}
	}
	if !ok {
		return false
	}
	if resp && seen&(1<<mRole) == 0 {
		// Other items (function call outputs, reasoning, ...) shape the key whole.
		p.parts = p.parts[:first]
		p.addPart(Part{Text: p.compactText(start, p.i, p.nws == nws), IsText: true})
		p.addMessage("item", first, unsafe.String(&p.b[start], p.i-start))
		return true
	}
	switch {
	case p.itemFailed():
	case seen&(1<<mRole) == 0:
		p.setErr(slotItems, BadRequest(where(resp, idx)+".role is required", "messages"))
	case !roleOK:
		p.setErr(slotItems, BadRequest(where(resp, idx)+".role must be a string", "messages"))
	case cerr != nil:
		p.setErr(slotItems, cerr)
	}
	if n := len(p.parts); hasName {
		if p.addPart(Part{}); len(p.parts) > n {
			copy(p.parts[first+1:], p.parts[first:])
			p.parts[first] = Part{Text: name, IsText: true}
		}
	}
	for i, has := range hasFold {
		if has {
			p.addPart(Part{Text: folds[i], IsText: true})
		}
	}
	p.addMessage(role, first, unsafe.String(&p.b[start], p.i-start))
	return true
}

// prefixed returns prefix followed by the decoded string at b[s:e].
func (p *parser) prefixed(prefix string, s, e int, esc bool) string {
	if p.counting {
		return ""
	}
	start := p.reserve(len(prefix) + e - s)
	p.arena = append(p.arena, prefix...)
	if esc {
		p.arena = appendUnescaped(p.arena, p.b[s:e])
	} else {
		p.arena = append(p.arena, p.b[s:e]...)
	}
	return p.arenaString(start)
}

// content reads a message content at depth: a string, null, or an array of
// parts. Text parts keep their text; other parts are hashed whole. The first
// error goes to *cerr.
func (p *parser) content(depth, idx int, resp bool, cerr **Error) bool {
	switch p.peek() {
	case 'n':
		return p.lit("null")
	case '"':
		s, e, esc, ok := p.str()
		if ok {
			p.addPart(Part{Text: p.text(s, e, esc), IsText: true})
		}
		return ok
	case '[':
	default:
		if *cerr == nil && !p.itemFailed() {
			*cerr = BadRequest(where(resp, idx)+".content must be a string, an array of content parts, or null", "messages")
		}
		return p.skip(depth)
	}
	more, ok := p.open(']'), true
	for j := 0; ok && more; j++ {
		if j == sizeAfter && !p.counting {
			p.parts = withRoom(p.parts, p.within(p.countRest(depth+1), unsafe.Sizeof(Part{})))
		}
		switch p.peek() {
		case '{':
			ok = p.part(depth+1, idx, resp, j, cerr)
		case '"': // the responses API allows bare strings
			var s, e int
			var esc bool
			if s, e, esc, ok = p.str(); ok {
				p.addPart(Part{Text: p.text(s, e, esc), IsText: true})
			}
		default:
			if *cerr == nil && !p.itemFailed() {
				*cerr = BadRequest(where(resp, idx)+".content["+strconv.Itoa(j)+"] must be an object", "messages")
			}
			ok = p.skip(depth + 1)
		}
		if ok {
			more, ok = p.next(']')
		}
	}
	return ok
}

// part reads content part j, an object at depth. A part with a "text" whose
// "type" is text, input_text, output_text or absent (or not a string) is a
// text part; any other part (an image, audio, a file) is hashed whole: FNV-1a
// over its JSON with the whitespace outside strings removed, strings kept as
// written (so the same image sent twice gets the same hash, and two images
// differing in any byte of their JSON get different ones).
func (p *parser) part(depth, idx int, resp bool, j int, cerr **Error) bool {
	start, nws := p.i, p.nws
	var seen uint8
	textLike := true
	var ts, te int
	var tesc, tstr bool
	more, ok := p.open('}'), true
	for ok && more {
		var k []byte
		if k, ok = p.member(); !ok {
			break
		}
		switch {
		case seen&1 == 0 && string(k) == "type":
			seen |= 1
			if p.peek() != '"' {
				ok = p.skip(depth + 1)
				break
			}
			var s, e int
			var esc bool
			if s, e, esc, ok = p.str(); ok {
				textLike = p.isTextType(s, e, esc)
			}
		case seen&2 == 0 && string(k) == "text":
			seen |= 2
			if p.peek() != '"' {
				ok = p.skip(depth + 1)
				break
			}
			ts, te, tesc, ok = p.str()
			tstr = ok
		default:
			ok = p.skip(depth + 1)
		}
		if ok {
			more, ok = p.next('}')
		}
	}
	if !ok {
		return false
	}
	if seen&2 != 0 && textLike {
		if !tstr {
			if *cerr == nil && !p.itemFailed() {
				*cerr = BadRequest(where(resp, idx)+".content["+strconv.Itoa(j)+"].text must be a string", "messages")
			}
			return true
		}
		p.addPart(Part{Text: p.text(ts, te, tesc), IsText: true})
		return true
	}
	p.addPart(Part{Hash: hashCompact(p.b[start:p.i], p.nws == nws)})
	return true
}

// isTextType reports whether the part type at b[s:e] names a text part.
func (p *parser) isTextType(s, e int, esc bool) bool {
	t := p.b[s:e]
	if esc {
		p.scratch = appendUnescaped(p.scratch[:0], t)
		t = p.scratch
	}
	switch string(t) {
	case "text", "input_text", "output_text", "":
		return true
	}
	return false
}

func (ps *promptState) bad(name string) {
	if ps.err == nil {
		ps.err = BadRequest("'"+name+"' must be a string, an array of strings, an array of token IDs, or an array of arrays of token IDs", name)
	}
}

// readPrompt reads a top-level prompt of the shapes the OpenAI API accepts:
// a string, a list of strings, a list of token IDs, or a list of lists of
// token IDs. The first element of a list decides which list it is.
func (p *parser) readPrompt(ps *promptState, name string) bool {
	switch p.peek() {
	case 'n':
		return p.lit("null")
	case '"':
		ps.present = true
		s, e, esc, ok := p.str()
		if ok {
			p.addText(ps, p.text(s, e, esc))
		}
		return ok
	case '[':
	default:
		ps.present = true
		ps.bad(name)
		return p.skip(1)
	}
	ps.present = true
	more, ok := p.open(']'), true
	if !more {
		if ps.err == nil {
			ps.err = BadRequest("'"+name+"' must not be empty", name)
		}
		return ok
	}
	mode := p.peek()
	first := len(ps.toks)
	for j := 0; ok && more; j++ {
		if j == sizeAfter && ps.err == nil {
			ps.reserve(p, mode, p.countRest(2))
		}
		c := p.peek()
		switch {
		case ps.err != nil:
			ok = p.skip(2)
		case mode == '"':
			if c != '"' {
				ps.bad(name)
				ok = p.skip(2)
				break
			}
			var s, e int
			var esc bool
			if s, e, esc, ok = p.str(); ok {
				p.addText(ps, p.text(s, e, esc))
			}
		case mode == '[':
			if c != '[' {
				ps.bad(name)
				ok = p.skip(2)
				break
			}
			ok = p.tokenList(ps, name)
		case mode == '-' || '0' <= mode && mode <= '9':
			ok = p.token(ps, name, 2)
		default:
			ps.bad(name)
			ok = p.skip(2)
		}
		if ok {
			more, ok = p.next(']')
		}
	}
	if ok && ps.err == nil && (mode == '-' || '0' <= mode && mode <= '9') {
		ps.p.Tokens = append(ps.p.Tokens, ps.toks[first:])
	}
	return ok
}

// reserve makes room for n more elements of a prompt list whose first
// element starts with mode (see readPrompt), within p's budget.
func (ps *promptState) reserve(p *parser, mode byte, n int) {
	switch mode {
	case '"':
		ps.p.Texts = withRoom(ps.p.Texts, p.within(n, unsafe.Sizeof("")))
	case '[':
		// One token a list at least.
		n = p.within(n, unsafe.Sizeof([]uint32(nil))+4)
		ps.p.Tokens = withRoom(ps.p.Tokens, n)
		ps.toks = withRoom(ps.toks, n)
	default:
		ps.toks = withRoom(ps.toks, p.within(n, 4))
	}
}

// tokenList reads a list of token IDs at depth 2.
func (p *parser) tokenList(ps *promptState, name string) bool {
	first := len(ps.toks)
	more, ok := p.open(']'), true
	for j := 0; ok && more; j++ {
		if j == sizeAfter && ps.err == nil {
			ps.reserve(p, '0', p.countRest(3))
		}
		if ok = p.token(ps, name, 3); ok {
			more, ok = p.next(']')
		}
	}
	if ok && ps.err == nil && !p.over() && !p.full(len(ps.p.Tokens), cap(ps.p.Tokens)) {
		p.built += int(unsafe.Sizeof([]uint32(nil)))
		ps.p.Tokens = append(ps.p.Tokens, ps.toks[first:])
	}
	return ok
}

// token reads one token ID at depth: a non-negative integer below 1<<32
// without fraction or exponent.
func (p *parser) token(ps *promptState, name string, depth int) bool {
	c := p.peek()
	if c != '-' && (c < '0' || '9' < c) {
		ps.bad(name)
		return p.skip(depth)
	}
	s := p.i
	if !p.num() {
		return false
	}
	var v uint64
	for _, d := range p.b[s:p.i] {
		if d < '0' || '9' < d || v > 1<<32-1 {
			ps.bad(name)
			return true
		}
		v = v*10 + uint64(d-'0')
	}
	if v > 1<<32-1 {
		ps.bad(name)
		return true
	}
	if ps.err == nil && !p.over() && !p.full(len(ps.toks), cap(ps.toks)) {
		p.built += 4
		if ps.toks == nil {
			ps.toks = make([]uint32, 0, 64)
		}
		ps.toks = append(ps.toks, uint32(v))
	}
	return true
}

// end applies the checks that need the whole body read.
func (p *parser) end() {
	switch p.kind {
	case KindChat:
		if p.seen&kMessages == 0 {
			p.setErr(slotShape, BadRequest("'messages' is required", "messages"))
		}
	case KindCompletion:
		p.usePrompt(&p.prompt, "prompt")
	case KindEmbedding:
		p.usePrompt(&p.prompt, "input")
	case KindGenerate:
		switch {
		case p.prompt.present:
			p.usePrompt(&p.prompt, keyText)
		case p.ids.present:
			p.usePrompt(&p.ids, keyInputIDs)
		default:
			p.setErr(slotShape, BadRequest("one of '"+keyText+"' or '"+keyInputIDs+"' is required", keyText))
		}
	case KindResponses:
		if !p.hasInput && p.seen&kPrevious == 0 {
			p.setErr(slotShape, BadRequest("'input' is required", "input"))
		}
	}
}

// usePrompt makes ps the request's prompt, or its error.
func (p *parser) usePrompt(ps *promptState, name string) {
	switch {
	case !ps.present:
		p.setErr(slotShape, BadRequest("'"+name+"' is required", name))
	case ps.err != nil:
		p.setErr(slotShape, ps.err)
	default:
		// Token lists were appended to one backing array that may have
		// moved since: slice them again from its final place.
		off := 0
		for i, t := range ps.p.Tokens {
			n := len(t)
			ps.p.Tokens[i] = ps.toks[off : off+n : off+n]
			off += n
		}
		p.req.Prompt = ps.p
	}
}

// finish points every message's Parts at its place in the final parts
// backing array (appends may have moved it since the message was read), and
// puts a responses request's instructions first.
func (p *parser) finish() {
	msgs := p.req.Messages
	sys := -1
	if p.hasInstr {
		sys = len(p.parts)
		p.parts = append(p.parts, Part{Text: p.instr, IsText: true})
	}
	off := 0
	for i := range msgs {
		n := len(msgs[i].Parts)
		if n == 0 {
			msgs[i].Parts = nil
			continue
		}
		msgs[i].Parts = p.parts[off : off+n : off+n]
		off += n
	}
	if sys >= 0 {
		msgs = append(msgs, Message{})
		copy(msgs[1:], msgs)
		msgs[0] = Message{Role: "system", Parts: p.parts[sys : sys+1 : sys+1]}
		p.req.Messages = msgs
	}
}

func shorten(s string) string {
	const limit = 200
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

// strOrSkip reads a string value (isStr true when one was read) or skips
// any other value at depth.
func (p *parser) strOrSkip(depth int) (s, e int, esc, isStr, ok bool) {
	if p.peek() != '"' {
		return 0, 0, false, false, p.skip(depth)
	}
	s, e, esc, ok = p.str()
	return s, e, esc, ok, ok
}
