package tokenize

import (
	"encoding/binary"
	"sync"
)

// smallPiece is the longest piece merged with the quadratic scan on the
// stack; longer pieces use a heap.
const smallPiece = 48

// appendText appends the tokens of text to dst. It produces exactly the tokens
// of tiktoken-go's EncodeOrdinary for the same encoding: the same pieces
// (see pretok.go), the same whole-piece lookup, and the same merge order
// (the lowest-ranked adjacent pair first, the leftmost of equals).
func (v *vocab) appendText(dst []uint32, text string) []uint32 {
	return v.appendValid(dst, validText(text))
}

// appendValid is appendText for text known to be valid UTF-8.
//
// Where eight bytes are left, a piece that is an ASCII word (the commonest in
// prose) is cut by wordCL100K or wordO200K, and if it is short, looked up by
// the bytes already loaded.
func (v *vocab) appendValid(dst []uint32, s string) []uint32 {
	word, next := wordCL100K, nextCL100K
	if v.o200k {
		word, next = wordO200K, nextO200K
	}
	for i := 0; i < len(s); {
		if i+8 <= len(s) {
			x := binary.LittleEndian.Uint64([]byte(s[i : i+8]))
			if j := word(s, i, x); j > 0 {
				dst = v.appendWord(dst, s, i, j, x)
				i = j
				continue
			}
		}
		j := next(s, i)
		dst = v.appendPiece(dst, s, i, j)
		i = j
	}
	return dst
}

// appendWord is appendPiece for s[i:j] whose first eight bytes are x.
func (v *vocab) appendWord(dst []uint32, s string, i, j int, x uint64) []uint32 {
	n := j - i
	if n > 8 {
		return v.appendPiece(dst, s, i, j)
	}
	if r, ok := v.toks.lookupShort(x&(^uint64(0)>>(64-8*uint(n))), n); ok {
		return append(dst, r)
	}
	return v.mergeSmall(dst, s[i:j])
}

// appendPiece appends the tokens of the pre-tokenized piece s[i:j].
func (v *vocab) appendPiece(dst []uint32, s string, i, j int) []uint32 {
	switch j - i {
	case 1:
		return append(dst, v.byteTok[s[i]])
	case 2:
		if r := v.bytePair[int(s[i])<<8|int(s[i+1])]; r != noRank {
			return append(dst, r)
		}
		return append(dst, v.byteTok[s[i]], v.byteTok[s[i+1]])
	}
	if r, ok := v.toks.lookup(s, i, j); ok {
		return append(dst, r)
	}
	p := s[i:j]
	if len(p) <= smallPiece {
		return v.mergeSmall(dst, p)
	}
	return v.mergeLarge(dst, p)
}

// mergeSmall is byte-pair merging by repeated scans, for short pieces.
func (v *vocab) mergeSmall(dst []uint32, p string) []uint32 {
	var ids, rk [smallPiece]uint32
	n := len(p)
	for i := 0; i < n; i++ {
		ids[i] = v.byteTok[p[i]]
	}
	for i := 0; i < n-1; i++ {
		rk[i] = v.bytePair[int(p[i])<<8|int(p[i+1])]
	}
	for n > 1 {
		best, at := noRank, -1
		for i, r := range rk[:n-1] {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		// Merge parts at and at+1 into the token best.
		// Close the gap with loops: pieces are short, and a memmove call
		// costs more than the few moves.
		ids[at] = best
		for k := at + 1; k < n-1; k++ {
			ids[k] = ids[k+1]
			rk[k] = rk[k+1]
		}
		n--
		if at+1 < n {
			rk[at] = v.pair(best, ids[at+1])
		} else {
			rk[at] = noRank
		}
		if at > 0 {
			rk[at-1] = v.pair(ids[at-1], best)
		}
	}
	return append(dst, ids[:n]...)
}

// mergeState is the scratch space of mergeLarge.
type mergeState struct {
	id   []uint32 // token of the part starting at each byte; noRank once merged away
	rank []uint32 // rank of merging the part with its successor
	next []int32
	prev []int32
	heap []uint64 // rank<<32 | start, a min-heap
}

var mergePool = sync.Pool{New: func() any { return new(mergeState) }}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// mergeLarge is byte-pair merging with a heap of candidate merges, for long
// pieces. Entries are validated lazily: an entry is live while its part
// exists and still has that rank with its successor. A changed pair always
// spells a different (longer) string, so its rank differs too.
func (v *vocab) mergeLarge(dst []uint32, p string) []uint32 {
	st := mergePool.Get().(*mergeState)
	n := len(p)
	st.id = grow(st.id, n)
	st.rank = grow(st.rank, n)
	st.next = grow(st.next, n)
	st.prev = grow(st.prev, n)
	h := st.heap[:0]
	for i := 0; i < n; i++ {
		st.id[i] = v.byteTok[p[i]]
		st.next[i] = int32(i + 1)
		st.prev[i] = int32(i - 1)
	}
	for i := 0; i < n; i++ {
		r := noRank
		if i+1 < n {
			r = v.bytePair[int(p[i])<<8|int(p[i+1])]
		}
		st.rank[i] = r
		if r != noRank {
			h = append(h, uint64(r)<<32|uint64(i))
		}
	}
	heapInit(h)
	for len(h) > 0 {
		var e uint64
		e, h = heapPop(h)
		r, i := uint32(e>>32), int32(uint32(e))
		if st.id[i] == noRank || st.rank[i] != r {
			continue
		}
		// Merge part i with its successor j.
		j := st.next[i]
		st.id[i] = r
		st.id[j] = noRank
		nj := st.next[j]
		st.next[i] = nj
		if int(nj) < n {
			st.prev[nj] = i
			nr := v.pair(r, st.id[nj])
			st.rank[i] = nr
			if nr != noRank {
				h = heapPush(h, uint64(nr)<<32|uint64(i))
			}
		} else {
			st.rank[i] = noRank
		}
		if pi := st.prev[i]; pi >= 0 {
			pr := v.pair(st.id[pi], r)
			st.rank[pi] = pr
			if pr != noRank {
				h = heapPush(h, uint64(pr)<<32|uint64(pi))
			}
		}
	}
	for i := int32(0); int(i) < n; i = st.next[i] {
		dst = append(dst, st.id[i])
	}
	st.heap = h
	mergePool.Put(st)
	return dst
}

func heapInit(h []uint64) {
	for i := len(h)/2 - 1; i >= 0; i-- {
		heapDown(h, i)
	}
}

func heapDown(h []uint64, i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r] < h[l] {
			m = r
		}
		if h[i] <= h[m] {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

func heapPush(h []uint64, e uint64) []uint64 {
	h = append(h, e)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	e := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	heapDown(h, 0)
	return e, h
}
