package precise

import (
	"errors"
	"fmt"
	"math"
)

// rdScanner reads a render or tokenize answer: the token ids of one
// top-level field, every other value checked and skipped, in one pass
// without building a tree (an answer is mostly its token ids).
type rdScanner struct {
	b []byte
	i int
}

var errRDSyntax = errors.New("bad answer: invalid JSON")

// rdAppendTokens appends to dst the token ids in field of the JSON object
// answer (of its first element when it is an array of objects) and
// returns it; on an error dst is returned as given. An object whose
// "features" (multimodal data) is not null is ErrRenderUnkeyed; its
// "cache_salt" does not change its tokens (the exact key starts from the
// salt).
func rdAppendTokens(answer []byte, field string, dst []uint32) ([]uint32, error) {
	s := rdScanner{b: answer}
	s.ws()
	out, found := dst, false
	var err error
	if s.peek() == '[' {
		s.i++
		s.ws()
		if s.peek() == ']' {
			return dst, errors.New("bad answer: empty array")
		}
		for first := true; ; first = false {
			if first {
				out, found, err = s.object(field, dst)
			} else {
				_, _, err = s.object("", nil)
			}
			if err != nil {
				return dst, err
			}
			s.ws()
			if s.peek() != ',' {
				break
			}
			s.i++
			s.ws()
		}
		if !s.eat(']') {
			return dst, errRDSyntax
		}
	} else if out, found, err = s.object(field, dst); err != nil {
		return dst, err
	}
	if s.ws(); s.i != len(s.b) {
		return dst, errRDSyntax
	}
	if !found {
		return dst, fmt.Errorf("bad answer: no %q array", field)
	}
	if len(out) == len(dst) {
		return dst, fmt.Errorf("bad answer: empty %q", field)
	}
	return out, nil
}

func (s *rdScanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *rdScanner) eat(c byte) bool {
	if s.peek() != c {
		return false
	}
	s.i++
	return true
}

func (s *rdScanner) ws() {
	for s.i < len(s.b) && rdIsSpace(s.b[s.i]) {
		s.i++
	}
}

// object reads an object at s.i, appending the ids of its member field
// (none when field is "") to dst.
func (s *rdScanner) object(field string, dst []uint32) (out []uint32, found bool, err error) {
	out = dst
	if !s.eat('{') {
		return dst, false, errors.New("bad answer: not an object")
	}
	s.ws()
	if s.eat('}') {
		return dst, false, nil
	}
	for {
		s.ws()
		start := s.i
		if !s.str() {
			return dst, false, errRDSyntax
		}
		key := s.b[start+1 : s.i-1]
		s.ws()
		if !s.eat(':') {
			return dst, false, errRDSyntax
		}
		s.ws()
		if field != "" && string(key) == field {
			if found {
				return dst, false, fmt.Errorf("bad answer: %q twice", field)
			}
			found = true
			if out, err = s.ids(field, dst); err != nil {
				return dst, false, err
			}
		} else {
			keyed := field != "" && string(key) == "features"
			vs := s.i
			if !s.skip(0) {
				return dst, false, errRDSyntax
			}
			if keyed && string(s.b[vs:s.i]) != "null" {
				return dst, false, fmt.Errorf("%w: %s", ErrRenderUnkeyed, key)
			}
		}
		s.ws()
		if s.eat('}') {
			return out, found, nil
		}
		if !s.eat(',') {
			return dst, false, errRDSyntax
		}
	}
}

// ids reads an array of token ids (integers in [0, 2^32)).
func (s *rdScanner) ids(field string, dst []uint32) ([]uint32, error) {
	if !s.eat('[') {
		return dst, fmt.Errorf("bad answer: %q is not an array", field)
	}
	s.ws()
	if s.eat(']') {
		return dst, nil
	}
	// The hot loop of an answer: locals only.
	b, i, out := s.b, s.i, dst
	for {
		for i < len(b) && rdIsSpace(b[i]) {
			i++
		}
		start := i
		var v uint64
		v, i = rdNumber(b, i)
		if n := i - start; n == 0 || v > math.MaxUint32 || n > 1 && b[start] == '0' {
			return dst, fmt.Errorf("bad answer: %s[%d] is not a token id", field, len(out)-len(dst))
		}
		out = append(out, uint32(v))
		for i < len(b) && rdIsSpace(b[i]) {
			i++
		}
		if i < len(b) && b[i] == ',' {
			i++
			continue
		}
		if i < len(b) && b[i] == ']' {
			s.i = i + 1
			return out, nil
		}
		return dst, fmt.Errorf("bad answer: %s[%d] is not a token id", field, len(out)-1-len(dst))
	}
}

// rdNumber reads the decimal digits at b[i:], at most 11 of them (more
// than any token id has), and returns their value and the index past
// them.
func rdNumber(b []byte, i int) (uint64, int) {
	var v uint64
	for start := i; i < len(b) && i-start < 11; i++ {
		d := b[i] - '0'
		if d > 9 {
			break
		}
		v = v*10 + uint64(d)
	}
	return v, i
}

func rdIsSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// str reads a string at s.i, escapes checked for form only.
func (s *rdScanner) str() bool {
	if !s.eat('"') {
		return false
	}
	for s.i < len(s.b) {
		c := s.b[s.i]
		s.i++
		switch {
		case c == '"':
			return true
		case c == '\\':
			if s.i >= len(s.b) {
				return false
			}
			s.i++
		case c < 0x20:
			return false
		}
	}
	return false
}

// rdMaxDepth bounds the nesting of a skipped value.
const rdMaxDepth = 64

// skip reads any value at s.i (numbers checked loosely).
func (s *rdScanner) skip(depth int) bool {
	if depth > rdMaxDepth {
		return false
	}
	switch c := s.peek(); c {
	case '"':
		return s.str()
	case '{', '[':
		closer := byte(']')
		if c == '{' {
			closer = '}'
		}
		s.i++
		s.ws()
		if s.eat(closer) {
			return true
		}
		for {
			s.ws()
			if c == '{' {
				if !s.str() {
					return false
				}
				s.ws()
				if !s.eat(':') {
					return false
				}
				s.ws()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.eat(closer) {
				return true
			}
			if !s.eat(',') {
				return false
			}
		}
	default:
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				return s.literal(s.b[start:s.i])
			}
			s.i++
		}
		return s.literal(s.b[start:s.i])
	}
}

// literal checks a scalar other than a string: true, false, null or a
// number.
func (s *rdScanner) literal(b []byte) bool {
	switch string(b) {
	case "true", "false", "null":
		return true
	case "":
		return false
	}
	for _, c := range b {
		if ok := '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; !ok {
			return false
		}
	}
	return true
}
