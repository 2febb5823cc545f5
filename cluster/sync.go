package cluster

import (
	"cmp"
	"encoding/binary"
	"errors"
	"slices"
)

// seqRange is the live batches from through until-1 of one peer: what a
// resync asks to be replayed. A batch this instance received live is never
// in a range it asks for, so no record is applied twice (a placement
// applied twice would count its prefill work twice).
type seqRange struct {
	from, until uint64
}

func (r seqRange) holds(seq uint64) bool { return seq >= r.from && seq < r.until }

// maxRanges bounds the ranges of one resync request. A peer owing more
// merges its closest ranges (owe), replaying the few batches between them
// a second time rather than missing any.
const maxRanges = 32

// A resync request (version 1), sealed as every message (auth.go):
//
//	sync := 'k' 's' version:u8 mac:[16] asker:string nranges (from until)*
const (
	syncMagic1  = 's'
	syncVersion = 1
)

// encodeSync is asker's resync request of ranges, its MAC left for
// sealer.seal.
func encodeSync(asker string, rs []seqRange) []byte {
	b := start(nil, syncMagic1, syncVersion)
	b = appendString(b, asker)
	b = binary.AppendUvarint(b, uint64(len(rs)))
	for _, r := range rs {
		b = binary.AppendUvarint(b, r.from)
		b = binary.AppendUvarint(b, r.until)
	}
	return b
}

var errSyncRanges = errors.New("resync request: bad ranges")

// decodeSync reads an opened resync request, b what follows its MAC: the
// asker and its ranges, which must be non-empty, at most maxRanges, each
// nonempty, in order and apart.
func decodeSync(b []byte) (string, []seqRange, error) {
	r := reader{b: b}
	asker := r.string()
	n := r.uvarint()
	if r.err == nil && (n == 0 || n > maxRanges) {
		r.fail(errSyncRanges)
	}
	var rs []seqRange
	for i := uint64(0); i < n && r.err == nil; i++ {
		s := seqRange{from: r.uvarint(), until: r.uvarint()}
		if r.err == nil && (s.until <= s.from || len(rs) > 0 && s.from <= rs[len(rs)-1].until) {
			r.fail(errSyncRanges)
		}
		rs = append(rs, s)
	}
	r.end()
	if r.err == nil && asker == "" {
		r.fail(errors.New("resync request: no asker"))
	}
	if r.err != nil {
		return "", nil, r.err
	}
	return asker, rs, nil
}

// owe adds range s to what the peer is owed by the next resync, keeping
// the ranges in order, apart and at most maxRanges.
func (p *peer) owe(s seqRange) {
	if s.until <= s.from {
		return
	}
	i, _ := slices.BinarySearchFunc(p.owed, s, func(a, b seqRange) int { return cmp.Compare(a.from, b.from) })
	p.owed = slices.Insert(p.owed, i, s)
	// Join what touches or overlaps.
	out := p.owed[:1]
	for _, r := range p.owed[1:] {
		last := &out[len(out)-1]
		if r.from <= last.until {
			last.until = max(last.until, r.until)
			continue
		}
		out = append(out, r)
	}
	p.owed = out
	for len(p.owed) > maxRanges {
		// Merge the two ranges with the fewest batches between them.
		best := 0
		for j := 1; j < len(p.owed)-1; j++ {
			if p.owed[j+1].from-p.owed[j].until < p.owed[best+1].from-p.owed[best].until {
				best = j
			}
		}
		p.owed[best].until = p.owed[best+1].until
		p.owed = slices.Delete(p.owed, best+1, best+2)
	}
}
