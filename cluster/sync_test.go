package cluster

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

func TestDecodeSync(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want []seqRange
	}{
		{"one", encodeSync("a", []seqRange{{0, 7}}), []seqRange{{0, 7}}},
		{"several", encodeSync("a", []seqRange{{3, 5}, {9, 10}, {12, 1 << 40}}), []seqRange{{3, 5}, {9, 10}, {12, 1 << 40}}},
		{"empty", start(nil, syncMagic1, syncVersion), nil},
		{"no asker", encodeSync("", []seqRange{{0, 7}}), nil},
		{"no ranges", encodeSync("a", nil), nil},
		{"empty range", encodeSync("a", []seqRange{{5, 5}}), nil},
		{"backwards", encodeSync("a", []seqRange{{6, 5}}), nil},
		{"out of order", encodeSync("a", []seqRange{{8, 9}, {1, 2}}), nil},
		{"touching", encodeSync("a", []seqRange{{1, 3}, {3, 4}}), nil},
		{"too many", encodeSync("a", make([]seqRange, maxRanges+1)), nil},
		{"cut short", encodeSync("a", []seqRange{{1, 300}})[:3+macLen+3], nil},
		{"trailing bytes", append(encodeSync("a", []seqRange{{1, 2}}), 0), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []seqRange
			b, err := testSeal.open(testSeal.seal(tc.b), syncMagic1, syncVersion)
			if err == nil {
				_, got, err = decodeSync(b)
			}
			if tc.want == nil {
				if err == nil {
					t.Fatalf("decoded %v, want an error", got)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("decoded %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// FuzzDecodeSync: no resync request panics its decoder, and a decoded one
// re-encodes to a request that decodes the same.
func FuzzDecodeSync(f *testing.F) {
	f.Add(encodeSync("a", []seqRange{{0, 9}})[3+macLen:])
	f.Add(encodeSync("b", []seqRange{{3, 5}, {9, 1 << 62}})[3+macLen:])
	f.Add([]byte{0x81})
	f.Fuzz(func(t *testing.T, b []byte) {
		asker, rs, err := decodeSync(b)
		if err != nil {
			return
		}
		if a2, got, err := decodeSync(encodeSync(asker, rs)[3+macLen:]); err != nil || a2 != asker || !reflect.DeepEqual(got, rs) {
			t.Fatalf("%v re-encoded decoded as %v, %v", rs, got, err)
		}
	})
}

// owe against a naive model, the set of owed batches: every batch owed is
// kept owed, none is added while the ranges fit in maxRanges, and the
// ranges stay valid for a request (decodeSync accepts their encoding).
func TestOweProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 300; trial++ {
		var p peer
		model := map[uint64]bool{}
		span := uint64(20 + rng.IntN(400))
		for i := 0; i < 1+rng.IntN(60); i++ {
			from := rng.Uint64N(span)
			r := seqRange{from: from, until: from + rng.Uint64N(6)}
			for s := r.from; s < r.until; s++ {
				model[s] = true
			}
			p.owe(r)
		}
		got := map[uint64]bool{}
		for _, r := range p.owed {
			for s := r.from; s < r.until; s++ {
				got[s] = true
			}
		}
		for s := range model {
			if !got[s] {
				t.Fatalf("trial %d: batch %d owed, not in %v", trial, s, p.owed)
			}
		}
		if len(p.owed) < maxRanges && len(got) != len(model) {
			t.Fatalf("trial %d: %d batches in %v, %d owed", trial, len(got), p.owed, len(model))
		}
		if len(model) == 0 {
			if p.owed != nil {
				t.Fatalf("trial %d: owes %v for nothing", trial, p.owed)
			}
			continue
		}
		if _, _, err := decodeSync(encodeSync("a", p.owed)[3+macLen:]); err != nil {
			t.Fatalf("trial %d: %v makes a bad request: %v", trial, p.owed, err)
		}
	}
}
