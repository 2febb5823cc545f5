package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/router"
)

// The batch format, version 4. All integers are unsigned varints unless
// said otherwise; a string is its length then its bytes.
//
//	batch   := 'k' 'r' version:u8 mac:[16] flags:u8 sender:string epoch seq base:varint record*
//	record  := kind:u8 fields (by kind, below)
//	place   := id at:varint replica:string model:string uncached nkey key:u32le*nkey nexact exact:u32le*nexact ticket
//	prefill, finish, fail := id
//	trim    := id cached
//	settle  := id work
//	cancel  := ticket
//	load    := replica:string inflight pending
//	session := at:varint session:[16] replica:string
//	stored  := id:[16] replica:string
//
// mac seals the batch (auth.go). epoch is drawn at random at the sender's
// start: a new epoch is a restart, a sequence at or below the last seen
// in the same epoch a replay. A session ID and a response id travel as
// their digests under the cluster's key (router.PeerDigest), never whole.
// base is the batch's time in Unix microseconds and at a record's time
// relative to it (signed). A place's ticket is the leader's (lead.go), 0
// for none. A Node writes base 0 (absolute times), so that
// one encoding of a record serves its live batch and its journal. A receiver skips a batch of another version:
// instances of two versions route each on its own view until all run one.
const (
	wireMagic0  = 'k'
	wireMagic1  = 'r'
	wireVersion = 4
)

// Batch flags.
const (
	flagResync = 1 << iota // a chunk of a resync reply, not a live batch
	flagLast               // the last chunk of a resync reply
)

type recKind uint8

// Record kinds.
const (
	recPlace recKind = 1 + iota
	recPrefill
	recFinish
	recFail
	recLoad
	recSession
	recStored
	recTrim
	recCancel // an ask the leader did not answer in time: its reservation goes
	recSettle // the engine's usage report: the placement's prefill work as computed
)

// Bounds on what a decoder accepts from a peer.
const (
	maxString = 4096    // bytes of a name, model, session or response id
	maxKey    = 1 << 20 // values of a routing key
)

// header is a batch's header.
type header struct {
	flags  uint8
	sender string
	epoch  uint64
	seq    uint64
	base   int64 // Unix microseconds
}

// record is one decoded record; which fields are set depends on kind.
type record struct {
	kind     recKind
	id       uint64 // placement id (place, prefill, finish, fail)
	at       int64  // Unix microseconds (place, session)
	replica  string
	model    string
	digest   router.PeerDigest // session (session) or response id (stored)
	uncached uint64
	inflight uint64
	pending  uint64
	cached   uint64 // engine-reported cached tokens (trim)
	work     uint64 // engine-computed prefill tokens (settle)
	key      []uint32
	exact    []uint32 // the exact key (place, precise mode)
	ticket   uint64   // the leader's reservation (place, cancel), 0 for none
}

// appendHeader appends h's encoding to b, the MAC left for sealer.seal
// once the records follow.
func appendHeader(b []byte, h header) []byte {
	b = start(b, wireMagic1, wireVersion)
	b = append(b, h.flags)
	b = appendString(b, h.sender)
	b = binary.AppendUvarint(b, h.epoch)
	b = binary.AppendUvarint(b, h.seq)
	return binary.AppendVarint(b, h.base)
}

// appendRecord appends r's encoding, its times relative to base, to b.
func appendRecord(b []byte, r *record, base int64) []byte {
	b = append(b, byte(r.kind))
	switch r.kind {
	case recPlace:
		b = binary.AppendUvarint(b, r.id)
		b = binary.AppendVarint(b, r.at-base)
		b = appendString(b, r.replica)
		b = appendString(b, r.model)
		b = binary.AppendUvarint(b, r.uncached)
		b = appendKey(b, r.key)
		b = appendKey(b, r.exact)
		b = binary.AppendUvarint(b, r.ticket)
	case recPrefill, recFinish, recFail:
		b = binary.AppendUvarint(b, r.id)
	case recTrim:
		b = binary.AppendUvarint(b, r.id)
		b = binary.AppendUvarint(b, r.cached)
	case recSettle:
		b = binary.AppendUvarint(b, r.id)
		b = binary.AppendUvarint(b, r.work)
	case recCancel:
		b = binary.AppendUvarint(b, r.ticket)
	case recLoad:
		b = appendString(b, r.replica)
		b = binary.AppendUvarint(b, r.inflight)
		b = binary.AppendUvarint(b, r.pending)
	case recSession:
		b = binary.AppendVarint(b, r.at-base)
		b = append(b, r.digest[:]...)
		b = appendString(b, r.replica)
	case recStored:
		b = append(b, r.digest[:]...)
		b = appendString(b, r.replica)
	}
	return b
}

func appendKey(b []byte, key []uint32) []byte {
	b = binary.AppendUvarint(b, uint64(len(key)))
	for _, v := range key {
		b = binary.LittleEndian.AppendUint32(b, v)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decoding errors.
var (
	errTruncated = errors.New("truncated batch")
	errMagic     = errors.New("not a kvroute cluster batch")
	errVersion   = errors.New("unsupported batch version")
)

// reader decodes a batch's fields in order; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *reader) uvarint() uint64 { return readVarint(r, binary.Uvarint) }

func (r *reader) varint() int64 { return readVarint(r, binary.Varint) }

// readVarint reads the value decode (binary.Uvarint or binary.Varint)
// finds at the front of r.b.
func readVarint[T uint64 | int64](r *reader, decode func([]byte) (T, int)) T {
	v, n := decode(r.b)
	if n <= 0 {
		r.fail(errTruncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.fail(errTruncated)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) string() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > maxString {
		r.fail(fmt.Errorf("string of %d bytes exceeds %d", n, maxString))
		return ""
	}
	if n > uint64(len(r.b)) {
		r.fail(errTruncated)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// digest reads a PeerDigest's bytes.
func (r *reader) digest() (d router.PeerDigest) {
	if len(r.b) < len(d) {
		r.fail(errTruncated)
		return d
	}
	copy(d[:], r.b)
	r.b = r.b[len(d):]
	return d
}

// key reads a count and that many little-endian values (nil for none).
func (r *reader) key() []uint32 {
	n := r.uvarint()
	if r.err != nil || n == 0 {
		return nil
	}
	if n > maxKey || n*4 > uint64(len(r.b)) {
		r.fail(fmt.Errorf("key of %d values does not fit the batch", n))
		return nil
	}
	k := make([]uint32, n)
	for i := range k {
		k[i] = binary.LittleEndian.Uint32(r.b[4*i:])
	}
	r.b = r.b[4*n:]
	return k
}

// time reads a varint time relative to base, refusing one that overflows.
func (r *reader) time(base int64) int64 {
	d := r.varint()
	if d > 0 && base > math.MaxInt64-d || d < 0 && base < math.MinInt64-d {
		r.fail(errors.New("record time out of range"))
		return 0
	}
	return base + d
}

// decodeHeader decodes the header of an opened batch, b what follows its
// MAC (sealer.open), and returns it with the records' bytes.
func decodeHeader(b []byte) (header, []byte, error) {
	var h header
	r := reader{b: b}
	h.flags = r.byte()
	h.sender = r.string()
	h.epoch = r.uvarint()
	h.seq = r.uvarint()
	h.base = r.varint()
	return h, r.b, r.err
}

// decodeRecords decodes the records of a batch whose base time is base,
// calling fn for each in order; rec is reused between calls (its key is a
// fresh slice each time, which fn may keep). A malformed record ends the
// decoding with an error, after the records before it went to fn.
func decodeRecords(b []byte, base int64, fn func(rec *record)) error {
	r := reader{b: b}
	var rec record
	for len(r.b) > 0 {
		rec = record{kind: recKind(r.byte())}
		switch rec.kind {
		case recPlace:
			rec.id = r.uvarint()
			rec.at = r.time(base)
			rec.replica = r.string()
			rec.model = r.string()
			rec.uncached = r.uvarint()
			rec.key = r.key()
			rec.exact = r.key()
			rec.ticket = r.uvarint()
		case recPrefill, recFinish, recFail:
			rec.id = r.uvarint()
		case recTrim:
			rec.id = r.uvarint()
			rec.cached = r.uvarint()
		case recSettle:
			rec.id = r.uvarint()
			rec.work = r.uvarint()
		case recCancel:
			rec.ticket = r.uvarint()
		case recLoad:
			rec.replica = r.string()
			rec.inflight = r.uvarint()
			rec.pending = r.uvarint()
		case recSession:
			rec.at = r.time(base)
			rec.digest = r.digest()
			rec.replica = r.string()
		case recStored:
			rec.digest = r.digest()
			rec.replica = r.string()
		default:
			r.fail(fmt.Errorf("unknown record kind %d", rec.kind))
		}
		if r.err != nil {
			return r.err
		}
		fn(&rec)
	}
	return nil
}
