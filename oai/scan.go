package oai

import (
	"encoding/binary"
	"math/bits"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting of a body, counted as the previous
// fastjson-based parser counted it (fastjson.MaxDepth): the top-level value
// is at depth 1, a value inside it at depth 2, and so on for scalars too; a
// value deeper than maxDepth makes the body invalid. Keeping fastjson's limit
// keeps the accept/reject decision of deep bodies unchanged.
const maxDepth = 300

// scanner validates JSON (RFC 8259) over a byte slice, one token at a time,
// without building values. Its methods return false on a syntax error, after
// recording the first one in syn; the position is then meaningless.
type scanner struct {
	b   []byte
	i   int    // next byte to read
	nws int    // incremented by every ws call that skipped something
	syn string // first syntax error, "" if none
	at  int    // offset of the first syntax error
}

// fail records a syntax error at the current position and returns false.
func (s *scanner) fail(msg string) bool {
	if s.syn == "" {
		s.syn, s.at = msg, s.i
	}
	return false
}

// synError describes the recorded syntax error.
func (s *scanner) synError() string {
	return s.syn + " at offset " + strconv.Itoa(s.at)
}

// ws skips insignificant whitespace (space, tab, line feed, carriage return).
func (s *scanner) ws() {
	i := s.i
	for i < len(s.b) {
		c := s.b[i]
		if c > ' ' || c != ' ' && c != '\n' && c != '\r' && c != '\t' {
			break
		}
		i++
	}
	if i != s.i {
		s.nws++
		s.i = i
	}
}

// peek returns the byte at the current position after whitespace, or 0 at
// the end of the input.
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special has the high bit of each byte of x (little endian) that may be a
// quote, a backslash, a control character or a non-ASCII byte set; the lowest
// set bit always marks the first such byte exactly (the borrows of the
// subtractions only set bits above a byte that is special).
func special(x uint64) uint64 {
	q := x ^ (lsb * '"')
	b := x ^ (lsb * '\\')
	return ((q-lsb)&^q | (b-lsb)&^b | (x - lsb*0x20) | x) & msb
}

// str scans the string whose opening quote is at s.i and returns the span of
// its raw contents (between the quotes) and whether it holds an escape. It
// checks the escapes, rejects raw control characters and invalid UTF-8.
func (s *scanner) str() (start, end int, esc, ok bool) {
	b := s.b
	i := s.i + 1
	start = i
	for {
		// Skip plain runs 32 bytes at a time, then find the first special
		// byte 8 at a time: prompts are long runs of plain text.
		for i+32 <= len(b) {
			w := b[i : i+32]
			if special(binary.LittleEndian.Uint64(w))|special(binary.LittleEndian.Uint64(w[8:]))|
				special(binary.LittleEndian.Uint64(w[16:]))|special(binary.LittleEndian.Uint64(w[24:])) != 0 {
				break
			}
			i += 32
		}
		for i+8 <= len(b) {
			if t := special(binary.LittleEndian.Uint64(b[i:])); t != 0 {
				i += bits.TrailingZeros64(t) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			s.i = i
			return 0, 0, false, s.fail("unterminated string")
		}
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return start, i, esc, true
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				s.i = i
				return 0, 0, false, s.fail("unterminated string")
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					s.i = i
					return 0, 0, false, s.fail(`invalid \u escape in string`)
				}
				i += 6
			default:
				s.i = i
				return 0, 0, false, s.fail("invalid escape in string")
			}
		case c < 0x20:
			s.i = i
			return 0, 0, false, s.fail("control character in string")
		case c >= 0x80:
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				s.i = i
				return 0, 0, false, s.fail("invalid UTF-8 in string")
			}
			i += n
		default:
			i++
		}
	}
}

// hex4 decodes four hexadecimal digits, or returns -1.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// lit scans the literal word (true, false or null) at s.i.
func (s *scanner) lit(word string) bool {
	if len(s.b)-s.i < len(word) || string(s.b[s.i:s.i+len(word)]) != word {
		return s.fail("invalid literal")
	}
	s.i += len(word)
	return true
}

// num scans a number at s.i: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) num() bool {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		s.i = i
		return s.fail("invalid number")
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		s.i = i
		return s.fail("invalid character")
	}
	if i < len(b) && b[i] == '.' {
		d := digits(b, i+1)
		if d == i+1 {
			s.i = d
			return s.fail("invalid number")
		}
		i = d
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := digits(b, i)
		if d == i {
			s.i = d
			return s.fail("invalid number")
		}
		i = d
	}
	s.i = i
	return true
}

// digits returns the index after the run of decimal digits of b at i.
func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// colon scans the ':' after an object key, with the whitespace around it.
func (s *scanner) colon() bool {
	if s.peek() != ':' {
		return s.fail("expected ':' after object key")
	}
	s.i++
	s.ws()
	return true
}

// key scans an object key and its colon, without returning the key.
func (s *scanner) key() bool {
	if s.peek() != '"' {
		return s.fail("expected string object key")
	}
	if _, _, _, ok := s.str(); !ok {
		return false
	}
	return s.colon()
}

// open scans the opening bracket at s.i and reports whether the container
// has members (false: it was empty and is consumed whole).
func (s *scanner) open(closer byte) (more bool) {
	s.i++
	if s.peek() == closer {
		s.i++
		return false
	}
	return true
}

// next scans what follows a member of a container: ',' (more members follow)
// or the closing bracket.
func (s *scanner) next(closer byte) (more, ok bool) {
	switch s.peek() {
	case ',':
		s.i++
		return true, true
	case closer:
		s.i++
		return false, true
	}
	if closer == '}' {
		return false, s.fail("expected ',' or '}' after object member")
	}
	return false, s.fail("expected ',' or ']' after array element")
}

// skip validates and skips one value at s.i (whitespace first), which is
// nested in depth containers. It is iterative: nesting costs one bit of a
// fixed stack per level, never a call frame.
func (s *scanner) skip(depth int) bool {
	var stack [(maxDepth + 63) / 64]uint64 // bit set: the level is an object
	base := depth
	for {
		c := s.peek()
		if s.i >= len(s.b) {
			return s.fail("unexpected end of input")
		}
		if depth >= maxDepth {
			return s.fail("nesting deeper than " + strconv.Itoa(maxDepth) + " levels")
		}
		switch c {
		case '{', '[':
			closer := byte(']')
			if c == '{' {
				closer = '}'
			}
			more := s.open(closer)
			if !more {
				break // an empty container: the value is complete
			}
			l := depth - base
			if c == '{' {
				stack[l>>6] |= 1 << (l & 63)
				if !s.key() {
					return false
				}
			} else {
				stack[l>>6] &^= 1 << (l & 63)
			}
			depth++
			continue
		case '"':
			if _, _, _, ok := s.str(); !ok {
				return false
			}
		case 't':
			if !s.lit("true") {
				return false
			}
		case 'f':
			if !s.lit("false") {
				return false
			}
		case 'n':
			if !s.lit("null") {
				return false
			}
		default:
			if !s.num() {
				return false
			}
		}
		// A value is complete: close the containers it completes.
		for {
			if depth == base {
				return true
			}
			l := depth - 1 - base
			obj := stack[l>>6]>>(l&63)&1 == 1
			closer := byte(']')
			if obj {
				closer = '}'
			}
			more, ok := s.next(closer)
			if !ok {
				return false
			}
			if more {
				if obj && !s.key() {
					return false
				}
				break
			}
			depth--
		}
	}
}

// appendUnescaped appends the decoded contents of a valid JSON string (raw,
// between the quotes) to dst. An unpaired surrogate escape decodes to
// U+FFFD, as encoding/json decodes it. Decoding never lengthens the text, so
// it writes in place into room for len(raw) more bytes.
func appendUnescaped(dst, raw []byte) []byte {
	n := len(dst)
	if cap(dst)-n < len(raw) {
		dst = append(dst, make([]byte, len(raw))...)
	}
	out := dst[n : n+len(raw)]
	w := 0
	for i := 0; i < len(raw); {
		j := backslash(raw, i)
		w += copy(out[w:], raw[i:j])
		if j == len(raw) {
			break
		}
		c := raw[j+1]
		i = j + 2
		switch c {
		case 'u':
			r := hex4(raw[i:])
			i += 4
			if utf16.IsSurrogate(r) {
				if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
					if pr := utf16.DecodeRune(r, hex4(raw[i+2:])); pr != utf8.RuneError {
						w += utf8.EncodeRune(out[w:], pr)
						i += 6
						continue
					}
				}
				r = utf8.RuneError
			}
			w += utf8.EncodeRune(out[w:], r)
			continue
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		} // '"', '\\', '/' stand for themselves
		out[w] = c
		w++
	}
	return dst[:n+w]
}

// backslash returns the index of the first backslash in b from i, or len(b).
func backslash(b []byte, i int) int {
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:]) ^ (lsb * '\\')
		if t := (x - lsb) &^ x & msb; t != 0 {
			return i + bits.TrailingZeros64(t)>>3
		}
	}
	for ; i < len(b); i++ {
		if b[i] == '\\' {
			return i
		}
	}
	return i
}

// appendCompact appends the valid JSON value raw with the whitespace outside
// its strings removed; strings are kept byte for byte, escapes included.
func appendCompact(dst, raw []byte) []byte {
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r':
		case '"':
			j := stringEnd(raw, i)
			dst = append(dst, raw[i:j]...)
			i = j - 1
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// stringEnd returns the index just past the closing quote of the valid JSON
// string whose opening quote is raw[i].
func stringEnd(raw []byte, i int) int {
	for i++; ; i++ {
		switch raw[i] {
		case '\\':
			i++ // the escaped byte; \u's hex digits are plain bytes
		case '"':
			return i + 1
		}
	}
}

// FNV-1a, 64 bits: stable across processes and platforms.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// hashCompact is FNV-1a over the compact form of the valid JSON value raw
// (what appendCompact would produce), without materializing it. compact
// says raw has no whitespace outside strings.
func hashCompact(raw []byte, compact bool) uint64 {
	h := uint64(fnvOffset)
	if compact {
		for _, c := range raw {
			h = (h ^ uint64(c)) * fnvPrime
		}
		return h
	}
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case ' ', '\t', '\n', '\r':
		case '"':
			j := stringEnd(raw, i)
			for _, c := range raw[i:j] {
				h = (h ^ uint64(c)) * fnvPrime
			}
			i = j - 1
		default:
			h = (h ^ uint64(c)) * fnvPrime
		}
	}
	return h
}
