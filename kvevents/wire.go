package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// reader walks msgpack values in a byte slice. It is written for bytes from
// the network: every length is checked against what is left before anything
// is allocated, and nesting is bounded, so malformed input is an error and
// never a large allocation, a deep recursion or a panic.
type reader struct {
	b   []byte
	off int
	// budget, when limited, is what decoding may still allocate, in
	// bytes (see DecodeWithin).
	budget  int64
	limited bool
}

// ErrDecodeBudget is Decode's error for a payload whose decoding would
// allocate more than its budget (DecodeWithin).
var ErrDecodeBudget = errors.New("kvevents: the batch decodes past its memory budget")

// charge counts n bytes about to be allocated against the budget.
func (r *reader) charge(n int64) error {
	if !r.limited {
		return nil
	}
	if r.budget -= n; r.budget < 0 {
		return ErrDecodeBudget
	}
	return nil
}

// maxDepth bounds the nesting skip follows; event payloads nest a few levels
// (batch, events, event, extra keys, a key's tuple).
const maxDepth = 32

var errShort = errors.New("kvevents: payload ends inside a value")

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || n > r.left() {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) code() (byte, error) {
	c, err := r.peek()
	if err == nil {
		r.off++
	}
	return c, err
}

// size reads a big-endian length of 1, 2 or 4 bytes.
func (r *reader) size(width int) (int, error) {
	p, err := r.next(width)
	if err != nil {
		return 0, err
	}
	switch width {
	case 1:
		return int(p[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(p)), nil
	default:
		return int(binary.BigEndian.Uint32(p)), nil
	}
}

// isNil consumes a nil and reports whether there was one.
func (r *reader) isNil() bool {
	if c, err := r.peek(); err == nil && c == 0xc0 {
		r.off++
		return true
	}
	return false
}

// kind is the family of the next value, enough to choose how to read it.
type kind int

const (
	kindOther kind = iota
	kindNil
	kindInt
	kindFloat
	kindString
	kindBytes
	kindArray
	kindMap
)

func (r *reader) kind() kind {
	c, err := r.peek()
	if err != nil {
		return kindOther
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		return kindInt
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return kindMap
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return kindArray
	case c >= 0xa0 && c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return kindString
	case c >= 0xc4 && c <= 0xc6:
		return kindBytes
	case c == 0xca || c == 0xcb:
		return kindFloat
	case c == 0xc0:
		return kindNil
	}
	return kindOther
}

// arrayLen reads an array header. The count is checked against the bytes
// left (every element takes at least one), so callers may size slices by it.
func (r *reader) arrayLen() (int, error) { return r.header("an array", 0x90, 0xdc, 1) }

// mapLen reads a map header; like arrayLen, the count is checked.
func (r *reader) mapLen() (int, error) { return r.header("a map", 0x80, 0xde, 2) }

// header reads the header of an array or a map: fix is the code of the
// empty fix form, code16 that of the 16-bit form (the 32-bit one follows
// it), and each element takes at least per bytes.
func (r *reader) header(what string, fix, code16 byte, per int) (int, error) {
	c, err := r.code()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= fix && c <= fix+0x0f:
		n = int(c - fix)
	case c == code16:
		n, err = r.size(2)
	case c == code16+1:
		n, err = r.size(4)
	default:
		return 0, fmt.Errorf("kvevents: want %s, got code 0x%02x", what, c)
	}
	if err == nil && n > r.left()/per {
		err = errShort
	}
	return n, err
}

// raw reads a string or bytes value and returns its bytes, aliasing r.b.
func (r *reader) raw() ([]byte, error) {
	c, err := r.code()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.size(1)
	case c == 0xda || c == 0xc5:
		n, err = r.size(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.size(4)
	default:
		return nil, fmt.Errorf("kvevents: want a string, got code 0x%02x", c)
	}
	if err != nil {
		return nil, err
	}
	return r.next(n)
}

func (r *reader) str() (string, error) {
	p, err := r.raw()
	if err == nil {
		err = r.charge(int64(len(p)))
	}
	return string(p), err
}

// optStr reads a string or nil ("").
func (r *reader) optStr() (string, error) {
	if r.isNil() {
		return "", nil
	}
	return r.str()
}

// integer reads any msgpack integer. Unsigned values above MaxInt64 come back
// with big set and their bits in u.
func (r *reader) integer() (i int64, u uint64, big bool, err error) {
	c, err := r.code()
	if err != nil {
		return 0, 0, false, err
	}
	switch {
	case c <= 0x7f:
		return int64(c), uint64(c), false, nil
	case c >= 0xe0:
		v := int64(c) - 256             // negative fixint
		return v, uint64(v), false, nil //nolint:gosec // two's complement reinterpretation is the intent
	}
	var width int
	switch c {
	case 0xcc, 0xd0:
		width = 1
	case 0xcd, 0xd1:
		width = 2
	case 0xce, 0xd2:
		width = 4
	case 0xcf, 0xd3:
		width = 8
	default:
		return 0, 0, false, fmt.Errorf("kvevents: want an integer, got code 0x%02x", c)
	}
	p, err := r.next(width)
	if err != nil {
		return 0, 0, false, err
	}
	var bits uint64
	for _, x := range p {
		bits = bits<<8 | uint64(x)
	}
	if c >= 0xd0 { // signed: extend the sign of the top byte
		shift := 64 - 8*width
		v := int64(bits<<shift) >> shift //nolint:gosec // two's complement reinterpretation is the intent
		return v, uint64(v), false, nil  //nolint:gosec // as above
	}
	if bits > math.MaxInt64 {
		return 0, bits, true, nil
	}
	return int64(bits), bits, false, nil
}

// intIn reads an integer and checks it lies in [lo, hi].
func (r *reader) intIn(what string, lo, hi int64) (int64, error) {
	v, _, big, err := r.integer()
	if err != nil {
		return 0, fmt.Errorf("kvevents: %s: %w", what, err)
	}
	if big || v < lo || v > hi {
		return 0, fmt.Errorf("kvevents: %s out of range", what)
	}
	return v, nil
}

// optInt reads an int or nil (0).
func (r *reader) optInt(what string) (int, error) {
	if r.isNil() {
		return 0, nil
	}
	v, err := r.intIn(what, math.MinInt32, math.MaxInt32)
	return int(v), err
}

// number reads a float or an integer as a float64.
func (r *reader) number() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		p, err := r.next(4)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(p))), nil
	case 0xcb:
		r.off++
		p, err := r.next(8)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(p)), nil
	}
	i, u, big, err := r.integer()
	if big {
		return float64(u), err
	}
	return float64(i), err
}

// hash reads an engine block hash: an integer of either sign (its 64 bits)
// or bytes, of which the last 8 are the hash, big-endian (vLLM's external
// form of a digest).
func (r *reader) hash() (uint64, error) {
	switch r.kind() {
	case kindInt:
		_, u, _, err := r.integer()
		return u, err
	case kindBytes, kindString:
		p, err := r.raw()
		if err != nil {
			return 0, err
		}
		if len(p) > 8 {
			p = p[len(p)-8:]
		}
		var h uint64
		for _, x := range p {
			h = h<<8 | uint64(x)
		}
		return h, nil
	}
	c, _ := r.peek()
	return 0, fmt.Errorf("kvevents: want a block hash, got code 0x%02x", c)
}

// list reads an array whose elements elem reads; an empty array is nil.
func list[T any](r *reader, elem func() (T, error)) ([]T, error) {
	n, err := r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	var zero T
	if err := r.charge(int64(n) * int64(unsafe.Sizeof(zero))); err != nil { //nolint:gosec // a type's size
		return nil, err
	}
	out := make([]T, n)
	for i := range out {
		if out[i], err = elem(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (r *reader) hashes() ([]uint64, error) { return list(r, r.hash) }

func (r *reader) tokens() ([]uint32, error) {
	return list(r, func() (uint32, error) {
		v, err := r.intIn("token id", 0, math.MaxUint32)
		return uint32(v), err //nolint:gosec // intIn checked the range
	})
}

// skip moves past one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("kvevents: values nested too deeply")
	}
	switch r.kind() {
	case kindArray:
		n, err := r.arrayLen()
		for i := 0; err == nil && i < n; i++ {
			err = r.skip(depth + 1)
		}
		return err
	case kindMap:
		n, err := r.mapLen()
		for i := 0; err == nil && i < 2*n; i++ {
			err = r.skip(depth + 1)
		}
		return err
	case kindString, kindBytes:
		_, err := r.raw()
		return err
	case kindInt:
		_, _, _, err := r.integer()
		return err
	case kindFloat:
		_, err := r.number()
		return err
	}
	c, err := r.code()
	if err != nil {
		return err
	}
	var n int
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16, plus the type byte
		n = 1<<(c-0xd4) + 1
	case 0xc7, 0xc8, 0xc9: // ext 8/16/32
		if n, err = r.size(1 << (c - 0xc7)); err != nil {
			return err
		}
		n++
	default:
		return fmt.Errorf("kvevents: invalid msgpack code 0x%02x", c)
	}
	_, err = r.next(n)
	return err
}

// rawValue returns a copy of the encoding of the next value.
func (r *reader) rawValue() ([]byte, error) {
	start := r.off
	if err := r.skip(0); err != nil {
		return nil, err
	}
	if err := r.charge(int64(r.off - start)); err != nil {
		return nil, err
	}
	return append([]byte(nil), r.b[start:r.off]...), nil
}
