package oai

// LookupString returns the string value at path in the JSON text b: path
// names a key of the top-level object, then a key of the object that is its
// value, and so on; the last key's value must be a string, which is returned
// decoded (a copy: it does not alias b). The first occurrence of each key is
// the one read.
//
// Only what comes before the value is read, and checked as JSON as far as it
// goes: a text cut short after the value still yields it, which lets a
// bounded prefix of a large body answer. ok is false when the value is not
// there, is not a string, or the text before it is not valid JSON.
func LookupString(b []byte, path ...string) (string, bool) {
	if len(path) == 0 {
		return "", false
	}
	s := scanner{b: b}
	for depth := 1; depth < maxDepth; depth++ {
		if s.peek() != '{' {
			return "", false
		}
		more := s.open('}')
		found := false
		for more {
			if s.peek() != '"' {
				return "", false
			}
			ks, ke, kesc, ok := s.str()
			if !ok || !s.colon() {
				return "", false
			}
			if keyIs(b[ks:ke], kesc, path[0]) {
				found = true
				break
			}
			if !s.skip(depth) {
				return "", false
			}
			if more, ok = s.next('}'); !ok {
				return "", false
			}
		}
		if !found {
			return "", false
		}
		if path = path[1:]; len(path) == 0 {
			if s.peek() != '"' {
				return "", false
			}
			vs, ve, vesc, ok := s.str()
			if !ok {
				return "", false
			}
			if !vesc {
				return string(b[vs:ve]), true
			}
			return string(appendUnescaped(nil, b[vs:ve])), true
		}
	}
	return "", false
}

// keyIs reports whether the raw key (between its quotes; esc: it holds an
// escape) is want once unescaped.
func keyIs(raw []byte, esc bool, want string) bool {
	if !esc {
		return string(raw) == want
	}
	if len(raw) < len(want) {
		return false // unescaping never lengthens a key
	}
	var buf [64]byte
	return string(appendUnescaped(buf[:0], raw)) == want
}
