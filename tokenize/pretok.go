package tokenize

import (
	"encoding/binary"
	"math/bits"
	"sync"
	"unicode"
	"unicode/utf8"
)

// The pre-tokenizers below are hand-written equivalents of the regular
// expressions tiktoken-go runs with github.com/dlclark/regexp2 (a backtracking
// engine with .NET semantics) on the runes of the text:
//
//	cl100k_base: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	             ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//	o200k_base:  [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	             [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|
//	             \p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// Each function returns the end of the match starting at i, following the
// engine's order: alternatives left to right, greedy quantifiers backing off
// one rune at a time. Every rune is matched by some alternative, so matches
// tile the text. regexp2 defines \s as unicode.IsSpace, \p{..} by Go's unicode
// tables, and (?i) by comparing unicode.ToLower of the input; the classes
// below are computed from exactly those.
//
// Both functions expect valid UTF-8 (see validText) and i < len(s).

// Rune classes, as bits.
const (
	clsL  uint8 = 1 << iota // \p{L}
	clsN                    // \p{N}
	clsS                    // \s
	clsNL                   // \r or \n
	clsUp                   // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	clsLo                   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	// clsMulti marks, in byteClass, a byte that starts no one-byte rune.
	clsMulti uint8 = 0x80
)

var (
	classOnce sync.Once
	// bmpClass holds the class of every rune below U+10000.
	bmpClass [0x10000]uint8
	// byteClass holds the class of each ASCII byte, and clsMulti for others.
	byteClass [256]uint8
)

func initClasses() {
	classOnce.Do(func() {
		for r := rune(0); r < 0x10000; r++ {
			bmpClass[r] = computeClass(r)
		}
		for b := range byteClass {
			if b < utf8.RuneSelf {
				byteClass[b] = bmpClass[b]
			} else {
				byteClass[b] = clsMulti
			}
		}
	})
}

// computeClass classifies r from Go's unicode tables.
func computeClass(r rune) uint8 {
	var c uint8
	if unicode.Is(unicode.L, r) {
		c |= clsL
	}
	if unicode.Is(unicode.N, r) {
		c |= clsN
	}
	if unicode.IsSpace(r) {
		c |= clsS
	}
	if r == '\r' || r == '\n' {
		c |= clsNL
	}
	both := unicode.Is(unicode.Lm, r) || unicode.Is(unicode.Lo, r) || unicode.Is(unicode.M, r)
	if both || unicode.Is(unicode.Lu, r) || unicode.Is(unicode.Lt, r) {
		c |= clsUp
	}
	if both || unicode.Is(unicode.Ll, r) {
		c |= clsLo
	}
	return c
}

// classAt returns the class and width of the rune at s[i].
func classAt(s string, i int) (uint8, int) {
	if c := byteClass[s[i]]; c != clsMulti {
		return c, 1
	}
	return classAtSlow(s, i)
}

func classAtSlow(s string, i int) (uint8, int) {
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return bmpClass[r], n
	}
	return computeClass(r), n
}

// scanWhile returns the end of the run of runes having any bit of cls from i.
// Letter classes skip ASCII letters eight bytes at a time first.
func scanWhile(s string, i int, cls uint8) int {
	if lo, hi, fold, ok := asciiLetters(cls); ok {
		for i+8 <= len(s) {
			stop := ^inRange8(binary.LittleEndian.Uint64([]byte(s[i:i+8])), lo, hi, fold) & highBits
			if stop != 0 {
				i += bits.TrailingZeros64(stop) >> 3
				break
			}
			i += 8
		}
	}
	for i < len(s) {
		c, n := byteClass[s[i]], 1
		if c == clsMulti {
			c, n = classAtSlow(s, i)
		}
		if c&cls == 0 {
			break
		}
		i += n
	}
	return i
}

// Byte-wise constants of the eight-bytes-at-once scan.
const (
	lowBits  = 0x0101010101010101
	highBits = 0x8080808080808080
)

// asciiLetters returns the ASCII part of a letter class as a byte range,
// after folding ASCII case when fold is set: [A-Za-z] for \p{L}, [a-z] for
// the lower-case class, [A-Z] for the upper-case one (ASCII has no Lt, Lm,
// Lo or M).
func asciiLetters(cls uint8) (lo, hi byte, fold, ok bool) {
	switch cls {
	case clsL:
		return 'a', 'z', true, true
	case clsLo:
		return 'a', 'z', false, true
	case clsUp:
		return 'A', 'Z', false, true
	}
	return 0, 0, false, false
}

// inRange8 returns, for each of the eight bytes of x, 0x80 when it is ASCII
// and (case-folded when fold is set) within [lo, hi], else 0. Clearing
// the top bits first keeps every byte's sum below 0x100, so no carry
// crosses bytes.
func inRange8(x uint64, lo, hi byte, fold bool) uint64 {
	t := x &^ highBits
	if fold {
		t |= 0x20 * lowBits
	}
	atLeast := t + uint64(0x80-lo)*lowBits
	above := t + uint64(0x7F-hi)*lowBits
	return atLeast &^ above &^ x & highBits
}

// scanPunct returns the end of the run of [^\s\p{L}\p{N}] from i.
func scanPunct(s string, i int) int {
	for i < len(s) {
		c, n := byteClass[s[i]], 1
		if c == clsMulti {
			c, n = classAtSlow(s, i)
		}
		if c&(clsS|clsL|clsN) != 0 {
			break
		}
		i += n
	}
	return i
}

// lowerIs reports whether the rune at s[i] lowercases (unicode.ToLower, as
// regexp2 does under (?i)) to the ASCII letter c; n is its width.
func lowerIs(s string, i int, c byte) (n int, ok bool) {
	if i >= len(s) {
		return 0, false
	}
	if b := s[i]; b < utf8.RuneSelf {
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		return 1, b == c
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return n, unicode.ToLower(r) == rune(c)
}

// contraction returns the length of (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i], or 0.
func contraction(s string, i int) int {
	if i >= len(s) || s[i] != '\'' {
		return 0
	}
	for _, c := range [...]byte{'s', 't', 'm', 'd'} {
		if n, ok := lowerIs(s, i+1, c); ok {
			return 1 + n
		}
	}
	for _, p := range [...][2]byte{{'r', 'e'}, {'v', 'e'}, {'l', 'l'}} {
		if n1, ok := lowerIs(s, i+1, p[0]); ok {
			if n2, ok := lowerIs(s, i+1+n1, p[1]); ok {
				return 1 + n1 + n2
			}
		}
	}
	return 0
}

// scanMarked scans the run of runes of class in that starts at i. It
// returns where the run ends, where its last rune also of class mark ends
// (-1: none), where its last rune starts (i: none) and how many runes it
// has.
func scanMarked(s string, i int, in, mark uint8) (end, markEnd, last, runes int) {
	end, markEnd, last = i, -1, i
	for end < len(s) {
		c, n := classAt(s, end)
		if c&in == 0 {
			break
		}
		if c&mark != 0 {
			markEnd = end + n
		}
		last = end
		end += n
		runes++
	}
	return end, markEnd, last, runes
}

// spaceEnd ends a match that starts with whitespace and that no earlier
// alternative took: \s*[\r\n]+ | \s+(?!\S) | \s+.
func spaceEnd(s string, i int) int {
	k, lastNL, last, runes := scanMarked(s, i, clsS, clsNL)
	switch {
	case lastNL >= 0: // \s*[\r\n]+ backs \s* off to the last line break
		return lastNL
	case k == len(s) || runes == 1: // \s+(?!\S) at the end, or \s+
		return k
	default: // \s+(?!\S) leaves the last space for the next word
		return last
	}
}

// numberEnd matches \p{N}{1,3} at i, whose first rune is a number of width n0.
func numberEnd(s string, i, n0 int) int {
	j := i + n0
	for k := 0; k < 2 && j < len(s); k++ {
		c, n := classAt(s, j)
		if c&clsN == 0 {
			break
		}
		j += n
	}
	return j
}

// nextCL100K returns the end of the cl100k_base piece starting at s[i].
func nextCL100K(s string, i int) int {
	b := s[i]
	c0, n0 := classAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if b == '\'' {
		if n := contraction(s, i); n > 0 {
			return i + n
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c0&clsL != 0 {
		return scanWhile(s, i+n0, clsL)
	}
	if c0&(clsNL|clsN) == 0 && i+n0 < len(s) {
		if c1, n1 := classAt(s, i+n0); c1&clsL != 0 {
			return scanWhile(s, i+n0+n1, clsL)
		}
	}
	// \p{N}{1,3}
	if c0&clsN != 0 {
		return numberEnd(s, i, n0)
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if b == ' ' {
		j++
	}
	if j < len(s) {
		if c, n := classAt(s, j); c&(clsS|clsL|clsN) == 0 {
			j = scanPunct(s, j+n)
			for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
				j++
			}
			return j
		}
	}
	// Only whitespace is left.
	return spaceEnd(s, i)
}

// withContraction extends a word ending at e by an optional contraction.
func withContraction(s string, e int) int {
	return e + contraction(s, e)
}

// wordUpLo matches [Up]*[Lo]+(?i:contraction)? at st.
func wordUpLo(s string, st int) (int, bool) {
	j, lastLo, _, _ := scanMarked(s, st, clsUp, clsLo)
	// [Up]* took the whole run: [Lo]+ must start right after it.
	if j < len(s) {
		if c, n := classAt(s, j); c&clsLo != 0 {
			return withContraction(s, scanWhile(s, j+n, clsLo)), true
		}
	}
	// Back off [Up]* to the last rune of the run that is also in [Lo]; [Lo]+
	// takes just it, since every later rune of the run is upper-only.
	if lastLo >= 0 {
		return withContraction(s, lastLo), true
	}
	return 0, false
}

// wordUp matches [Up]+[Lo]*(?i:contraction)? at st.
func wordUp(s string, st int) (int, bool) {
	j := scanWhile(s, st, clsUp)
	if j == st {
		return 0, false
	}
	return withContraction(s, scanWhile(s, j, clsLo)), true
}

// nextO200K returns the end of the o200k_base piece starting at s[i].
func nextO200K(s string, i int) int {
	c0, n0 := classAt(s, i)
	// [^\r\n\p{L}\p{N}]? is tried present first, then absent.
	opt := c0&(clsNL|clsL|clsN) == 0 && i+n0 < len(s)
	if opt {
		if e, ok := wordUpLo(s, i+n0); ok {
			return e
		}
	}
	if c0&(clsUp|clsLo) != 0 {
		if e, ok := wordUpLo(s, i); ok {
			return e
		}
	}
	if opt {
		if e, ok := wordUp(s, i+n0); ok {
			return e
		}
	}
	if c0&clsUp != 0 {
		if e, ok := wordUp(s, i); ok {
			return e
		}
	}
	// \p{N}{1,3}
	if c0&clsN != 0 {
		return numberEnd(s, i, n0)
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n/]*
	j := i
	if s[i] == ' ' {
		j++
	}
	if j < len(s) {
		if c, n := classAt(s, j); c&(clsS|clsL|clsN) == 0 {
			j = scanPunct(s, j+n)
			for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
				j++
			}
			return j
		}
	}
	return spaceEnd(s, i)
}

// validText returns s with every byte that is not part of a valid UTF-8
// sequence replaced by U+FFFD, as Go's []rune(s) conversion (and so
// tiktoken-go) does; valid text is returned as is.
func validText(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	out := make([]byte, 0, len(s)+len(s)/2)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			out = utf8.AppendRune(out, utf8.RuneError)
		} else {
			out = append(out, s[i:i+n]...)
		}
		i += n
	}
	return string(out)
}

// The functions below are fast paths of nextCL100K and nextO200K for the
// commonest piece of prose, an ASCII word: letters, after an optional one-byte
// prefix such as a space. They read the eight bytes x of the text at i (the
// caller checks i+8 <= len(s)) and return the end of the piece, or 0 when the
// piece is not of that shape and the general functions must decide. A run of
// letters ending at an ASCII byte ends its piece whatever follows, so
// classifying the eight bytes at once is enough; a run reaching a non-ASCII
// byte (perhaps a letter) goes the general way.

// asciiPrefix reports whether b is an ASCII byte of [^\r\n\p{L}\p{N}], the
// optional byte before a word.
func asciiPrefix(b byte) bool {
	return byteClass[b]&(clsL|clsN|clsNL|clsMulti) == 0
}

// wordCL100K is nextCL100K(s, i) when s[i:] starts with [A-Za-z] or with one
// ASCII byte of [^\r\n\p{L}\p{N}] other than an apostrophe and then [A-Za-z].
// The apostrophe is left out as it may start a contraction, the first
// alternative. Either start takes the alternative [^\r\n\p{L}\p{N}]?\p{L}+,
// as nextCL100K does, and \p{L}+ ends at the first ASCII non-letter.
func wordCL100K(s string, i int, x uint64) int {
	letters := inRange8(x, 'a', 'z', true)
	if letters&0x80 == 0 {
		// No letter at i: a prefix then a letter?
		if b := byte(x); letters&0x8000 == 0 || b == '\'' || !asciiPrefix(b) {
			return 0
		}
	}
	// The first byte after i that is no ASCII letter ends the run.
	stop := ^letters & highBits &^ 0x80
	if stop == 0 {
		return scanWhile(s, i+8, clsL)
	}
	k := bits.TrailingZeros64(stop) >> 3
	if byte(x>>(8*k)) >= utf8.RuneSelf {
		return 0
	}
	return i + k
}

// wordO200K is nextO200K(s, i) when s[i:] starts with [a-z], [A-Z][a-z], or
// one ASCII byte of [^\r\n\p{L}\p{N}] and then [a-z] or [A-Z][a-z]. These
// take the first alternative,
// [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?,
// with the optional byte present if it is there (nextO200K tries it first),
// [Up]* taking the one capital if any (the lower-case letter after it is not
// in [Up], so [Up]* stops there), and [Lo]+ the run of [a-z] from there. The
// run ends at the first ASCII byte that is not in [a-z]; the optional
// contraction cannot match unless that byte is an apostrophe, which goes
// the general way.
func wordO200K(s string, i int, x uint64) int {
	lower := inRange8(x, 'a', 'z', false)
	upper := inRange8(x, 'A', 'Z', false)
	// run is the index in x of the first letter of [Lo]+.
	var run int
	switch {
	case lower&0x80 != 0:
		run = 0
	case upper&0x80 != 0 || asciiPrefix(byte(x)):
		// A capital or a prefix, then [a-z] or [A-Z][a-z] (a prefix only).
		switch {
		case lower&0x8000 != 0:
			run = 1
		case upper&0x80 == 0 && upper&0x8000 != 0 && lower&0x800000 != 0:
			run = 2
		default:
			return 0
		}
	default:
		return 0
	}
	stop := ^lower & highBits &^ (1<<(8*(run+1)) - 1)
	if stop == 0 {
		return withContraction(s, scanWhile(s, i+8, clsLo))
	}
	k := bits.TrailingZeros64(stop) >> 3
	if b := byte(x >> (8 * k)); b >= utf8.RuneSelf || b == '\'' {
		return 0
	}
	return i + k
}
