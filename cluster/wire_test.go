package cluster

import (
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/router"
)

// testSeal seals as the members of testConfig do.
var testSeal = func() *sealer {
	k, err := deriveKeys(testConfig(""))
	if err != nil {
		panic(err)
	}
	return newSealer(k.message)
}()

func sampleRecords() []record {
	return []record{
		{kind: recPlace, id: 7, at: 1_700_000_000_000_000, replica: "e1", model: "m", uncached: 4096, key: []uint32{1, 2, 0xffffffff}, exact: []uint32{9, 8}},
		{kind: recPlace, id: 8, at: 1_700_000_000_000_100, replica: "e2", model: "", uncached: 0, ticket: 1 << 63},
		{kind: recCancel, ticket: 12345},
		{kind: recPrefill, id: 7},
		{kind: recFinish, id: 7},
		{kind: recFail, id: 8},
		{kind: recTrim, id: 7, cached: 320},
		{kind: recSettle, id: 7, work: 3776},
		{kind: recLoad, replica: "e1", inflight: 3, pending: 12000},
		{kind: recSession, at: 1_699_999_999_000_000, digest: router.PeerDigest{1, 2, 3}, replica: "e3"},
		{kind: recStored, digest: router.PeerDigest{15: 0xff}, replica: "e0"},
	}
}

// encode is a batch of recs sealed as testConfig's members seal.
func encode(h header, recs []record) []byte {
	b := appendHeader(nil, h)
	for i := range recs {
		b = appendRecord(b, &recs[i], h.base)
	}
	return testSeal.seal(b)
}

// decodeAll opens b as testConfig's members do and decodes it.
func decodeAll(t testing.TB, b []byte) (header, []record, error) {
	body, err := testSeal.open(b, wireMagic1, wireVersion)
	if err != nil {
		return header{}, nil, err
	}
	return decodeBody(t, body)
}

// decodeBody decodes an opened batch, b what follows its MAC.
func decodeBody(_ testing.TB, b []byte) (header, []record, error) {
	h, body, err := decodeHeader(b)
	if err != nil {
		return h, nil, err
	}
	var out []record
	err = decodeRecords(body, h.base, func(r *record) { out = append(out, *r) })
	return h, out, err
}

func TestWireRoundTrip(t *testing.T) {
	for _, base := range []int64{0, 1_700_000_000_000_000, -5} {
		h := header{flags: flagResync | flagLast, sender: "router-a", epoch: 1 << 60, seq: 99, base: base}
		recs := sampleRecords()
		gh, got, err := decodeAll(t, encode(h, recs))
		if err != nil {
			t.Fatal(err)
		}
		if gh != h {
			t.Errorf("header %+v, want %+v", gh, h)
		}
		if !reflect.DeepEqual(got, recs) {
			t.Errorf("records\n%+v\nwant\n%+v", got, recs)
		}
	}
}

// A random batch decodes to what was encoded, and every cut of it either
// decodes to a prefix of its records or fails: it never yields a record
// that was not there.
func TestWireRandomAndTruncated(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []recKind{recPlace, recPrefill, recFinish, recFail, recLoad, recSession, recStored, recTrim, recSettle, recCancel}
	for it := 0; it < 300; it++ {
		var recs []record
		for j := rng.IntN(6); j > 0; j-- {
			r := record{kind: kinds[rng.IntN(len(kinds))]}
			switch r.kind {
			case recPlace:
				r.id, r.at, r.replica, r.model, r.uncached = rng.Uint64(), rng.Int64N(1<<53), "r", "model", rng.Uint64N(1<<20)
				for k := rng.IntN(40); k > 0; k-- {
					r.key = append(r.key, rng.Uint32())
				}
				for k := rng.IntN(3) * 7; k > 0; k-- {
					r.exact = append(r.exact, rng.Uint32())
				}
			case recPrefill, recFinish, recFail:
				r.id = rng.Uint64()
			case recTrim:
				r.id, r.cached = rng.Uint64(), rng.Uint64N(1<<20)
			case recSettle:
				r.id, r.work = rng.Uint64(), rng.Uint64N(1<<20)
			case recCancel:
				r.ticket = rng.Uint64()
			case recLoad:
				r.replica, r.inflight, r.pending = "x", rng.Uint64N(100), rng.Uint64N(1<<30)
			case recSession:
				r.at, r.digest, r.replica = rng.Int64N(1<<53), router.PeerDigest{byte(rng.Uint32())}, "y"
			case recStored:
				r.digest, r.replica = router.PeerDigest{7: byte(rng.Uint32())}, "z"
			}
			recs = append(recs, r)
		}
		h := header{sender: "p", seq: uint64(it), base: rng.Int64N(1 << 53)}
		b := encode(h, recs)
		_, got, err := decodeAll(t, b)
		if err != nil || len(got) != len(recs) || len(recs) > 0 && !reflect.DeepEqual(got, recs) {
			t.Fatalf("round trip: %v\n%+v\nwant\n%+v", err, got, recs)
		}
		payload := b[3+macLen:]
		for cut := 0; cut < len(payload); cut++ {
			_, part, _ := decodeBody(t, payload[:cut])
			if len(part) > len(recs) || len(part) > 0 && !reflect.DeepEqual(part, recs[:len(part)]) {
				t.Fatalf("cut at %d of %d decoded %+v, not a prefix of %+v", cut, len(b), part, recs)
			}
		}
	}
}

func TestWireRejects(t *testing.T) {
	good := encode(header{sender: "a", seq: 1}, sampleRecords()[:1])
	cases := map[string][]byte{
		"empty":        nil,
		"magic":        append([]byte("xx"), good[2:]...),
		"version":      append([]byte{'k', 'r', 9}, good[3:]...),
		"unknown kind": testSeal.seal(append(append([]byte(nil), good...), 200)),
		"unsealed":     append(append([]byte(nil), good[:3]...), append(make([]byte, macLen), good[3+macLen:]...)...),
		"another key":  newSealer([]byte("another")).seal(append([]byte(nil), good...)),
		"huge string":  testSeal.seal(append(appendHeader(nil, header{sender: "a"}), byte(recSession), 0, 0xff, 0xff, 0x7f)),
		"huge key": testSeal.seal(append(appendHeader(nil, header{sender: "a"}), byte(recPlace), 1, 0, 0, 0, 0,
			0xff, 0xff, 0xff, 0x7f)),
	}
	for name, b := range cases {
		if _, _, err := decodeAll(t, b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecode: no input panics the decoder, and what decodes re-encodes to
// a batch that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(encode(header{sender: "a", seq: 1, base: 1_700_000_000_000_000}, sampleRecords()))
	f.Add(encode(header{flags: flagResync | flagLast, sender: "b"}, nil))
	f.Add([]byte("kr\x04\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Sealed or not: what a member may send is what follows the MAC.
		_, _, _ = decodeAll(t, b)
		h, recs, err := decodeBody(t, b)
		if err != nil {
			return
		}
		h2, recs2, err := decodeAll(t, encode(h, recs))
		if err != nil {
			t.Fatalf("re-encoded batch did not decode: %v", err)
		}
		if h2 != h || !reflect.DeepEqual(recs2, recs) {
			t.Fatalf("re-encoded batch decoded differently")
		}
	})
}

func TestJournalBoundAndHorizon(t *testing.T) {
	j := journal{max: 100}
	for i := 0; i < 50; i++ {
		j.add(int64(i), uint64(i/2), make([]byte, 10))
	}
	if j.size() > 100 {
		t.Errorf("journal holds %d bytes, bound 100", j.size())
	}
	var n int
	all := []seqRange{{0, math.MaxUint64}}
	for _, c := range j.chunks(0, all, 25) {
		if len(c) > 25 {
			t.Errorf("chunk of %d bytes, want at most 25", len(c))
		}
		n += len(c)
	}
	if n != 100 {
		t.Errorf("chunks hold %d bytes, want the 100 kept", n)
	}
	// Only the newest: times 40..49 are kept; from 45 on, 5 records.
	n = 0
	for _, c := range j.chunks(45, all, 1000) {
		n += len(c)
	}
	if n != 50 {
		t.Errorf("records from time 45: %d bytes, want 50", n)
	}
	// Batches 21 and 24 (of 20..24 kept): times 42, 43, 48 and 49.
	n = 0
	for _, c := range j.chunks(0, []seqRange{{21, 22}, {24, 30}}, 1000) {
		n += len(c)
	}
	if n != 40 {
		t.Errorf("records of batches 21 and 24: %d bytes, want 40", n)
	}
}
