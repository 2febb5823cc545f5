package kvevents

import (
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// Decode reads one event batch payload in either encoding: a positional
// array [ts, events, dp_rank, ...] or a map with keys "ts", "events" and
// "data_parallel_rank" (SGLang: "attn_dp_rank"); each event likewise as an
// array led by its type tag or as a map with a "type" key. Fields an engine
// adds after the known ones are ignored, optional ones may be missing, and
// events of an unknown type are left out and counted in Batch.Skipped.
// Anything else that is not what an engine sends is an error.
func Decode(payload []byte) (Batch, error) {
	return decode(&reader{b: payload})
}

// DecodeWithin is Decode allocating at most budget bytes for the batch
// (its events, their fields, their copies of strings); a payload that
// needs more is ErrDecodeBudget. Every value read takes at least one byte
// of the payload, so what a real batch decodes to is a small multiple of
// its size (under 4 for the engines' batches); a crafted one can ask for
// up to 24 (an array of nil extra keys), which the budget refuses.
func DecodeWithin(payload []byte, budget int64) (Batch, error) {
	return decode(&reader{b: payload, budget: budget, limited: true})
}

func decode(r *reader) (Batch, error) {
	var b Batch
	var err error
	switch r.kind() {
	case kindArray:
		err = decodeBatchArray(r, &b)
	case kindMap:
		err = decodeBatchMap(r, &b)
	default:
		err = errors.New("kvevents: a batch is an array or a map")
	}
	if err == nil && r.left() != 0 {
		err = fmt.Errorf("kvevents: %d bytes after the batch", r.left())
	}
	if err != nil {
		return Batch{}, err
	}
	return b, nil
}

func decodeBatchArray(r *reader, b *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return errors.New("kvevents: a batch array needs ts and events")
	}
	if b.TS, err = r.number(); err != nil {
		return fmt.Errorf("kvevents: batch ts: %w", err)
	}
	if err = decodeEvents(r, b); err != nil {
		return err
	}
	if n > 2 {
		if b.DPRank, err = r.optInt("dp rank"); err != nil {
			return err
		}
	}
	return skipN(r, n-3)
}

func decodeBatchMap(r *reader, b *Batch) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	var haveTS, haveEvents bool
	for range n {
		key, err := r.str()
		if err != nil {
			return fmt.Errorf("kvevents: batch key: %w", err)
		}
		switch key {
		case keyTS:
			b.TS, err = r.number()
			haveTS = true
		case keyEvents:
			err = decodeEvents(r, b)
			haveEvents = true
		case keyDPRank, keySGLangDPRank:
			b.DPRank, err = r.optInt("dp rank")
		default:
			err = r.skip(1)
		}
		if err != nil {
			return fmt.Errorf("kvevents: batch %s: %w", key, err)
		}
	}
	if !haveTS || !haveEvents {
		return errors.New("kvevents: a batch map needs ts and events")
	}
	return nil
}

func skipN(r *reader, n int) error {
	for range n {
		if err := r.skip(1); err != nil {
			return err
		}
	}
	return nil
}

func decodeEvents(r *reader, b *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("kvevents: events: %w", err)
	}
	// Events of a known type take at least minEventBytes each: no more
	// of them fit in what is left.
	if c := min(n, r.left()/minEventBytes); c > 0 {
		if err := r.charge(int64(c) * int64(unsafe.Sizeof(Event(nil)))); err != nil {
			return err
		}
		b.Events = make([]Event, 0, c)
	}
	for i := range n {
		ev, err := decodeEvent(r)
		if err == nil && ev != nil {
			err = r.charge(eventBytes(ev))
		}
		if err != nil {
			return fmt.Errorf("kvevents: event %d: %w", i, err)
		}
		if ev == nil {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	if len(b.Events) == 0 {
		b.Events = nil
	}
	return nil
}

// minEventBytes is the least a known event takes in a payload: a
// BlockRemoved of no hashes, [tag, []], is 15 bytes.
const minEventBytes = 15

// eventBytes is what ev takes on the heap as an Event.
func eventBytes(ev Event) int64 {
	switch ev.(type) {
	case BlockStored:
		return int64(unsafe.Sizeof(BlockStored{}))
	case BlockRemoved:
		return int64(unsafe.Sizeof(BlockRemoved{}))
	}
	return 0
}

// decodeEvent reads one event, or skips it and returns nil when its type is
// unknown.
func decodeEvent(r *reader) (Event, error) {
	switch r.kind() {
	case kindArray:
		return decodeEventArray(r)
	case kindMap:
		return decodeEventMap(r)
	}
	return nil, errors.New("an event is an array or a map")
}

// Positions of BlockStored's fields in the positional encoding, after the
// type tag at 0 (vLLM's field order; SGLang sends the first six).
const (
	posHashes = 1 + iota
	posParent
	posTokens
	posBlockSize
	posLoraID
	posMedium
	posLoraName
	posExtraKeys
	posGroup
	posSpecKind
	posOther // any later position: skipped
)

// removedOrder gives BlockRemoved's positional fields as positions of
// BlockStored's (they share names and types).
var removedOrder = [...]int{posHashes, posMedium, posGroup}

// storedKeys names the fields at their positions: the tagged encoding's keys.
var storedKeys = [posOther]string{
	posHashes: keyHashes, posParent: keyParent, posTokens: keyTokens,
	posBlockSize: keyBlockSize, posLoraID: keyLoraID, posMedium: keyMedium,
	posLoraName: keyLoraName, posExtraKeys: keyExtraKeys, posGroup: keyGroup,
	posSpecKind: keySpecKind,
}

// storedPos maps the tagged encoding's keys to the positions of the fields.
var storedPos = func() map[string]int {
	m := make(map[string]int, len(storedKeys))
	for pos, key := range storedKeys {
		if key != "" {
			m[key] = pos
		}
	}
	return m
}()

func decodeEventArray(r *reader) (Event, error) {
	n, err := r.arrayLen()
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, errors.New("an event array needs its type")
	}
	tag, err := r.str()
	if err != nil {
		return nil, fmt.Errorf("event type: %w", err)
	}
	if !known(tag) {
		return nil, skipN(r, n-1)
	}
	var st BlockStored
	var seen uint
	for i := 1; i < n; i++ {
		pos := min(i, posOther)
		switch {
		case tag == TypeAllBlocksCleared:
			pos = posOther
		case tag == TypeBlockRemoved && i <= len(removedOrder):
			pos = removedOrder[i-1]
		case tag == TypeBlockRemoved:
			pos = posOther
		}
		seen |= 1 << pos
		if err := st.field(r, pos); err != nil {
			return nil, fmt.Errorf("%s: %w", tag, err)
		}
	}
	return build(tag, st, seen)
}

func known(typ string) bool {
	return typ == TypeBlockStored || typ == TypeBlockRemoved || typ == TypeAllBlocksCleared
}

// build makes the event of type typ from the fields read into st, of which
// seen has a bit set for each position present.
func build(typ string, st BlockStored, seen uint) (Event, error) {
	has := func(pos ...int) bool {
		for _, p := range pos {
			if seen&(1<<p) == 0 {
				return false
			}
		}
		return true
	}
	switch typ {
	case TypeBlockStored:
		if !has(posHashes, posTokens, posBlockSize) {
			return nil, errors.New("BlockStored needs block_hashes, token_ids and block_size")
		}
		return st, nil
	case TypeBlockRemoved:
		if !has(posHashes) {
			return nil, errors.New("BlockRemoved needs block_hashes")
		}
		return BlockRemoved{BlockHashes: st.BlockHashes, Medium: st.Medium, GroupIdx: st.GroupIdx}, nil
	}
	return AllBlocksCleared{}, nil
}

// field reads BlockStored's field at position pos of the positional
// encoding; other positions are skipped.
func (ev *BlockStored) field(r *reader, pos int) error {
	var err error
	switch pos {
	case posHashes:
		ev.BlockHashes, err = r.hashes()
	case posParent:
		err = ev.parent(r)
	case posTokens:
		ev.TokenIDs, err = r.tokens()
	case posBlockSize:
		err = ev.blockSize(r)
	case posLoraID:
		err = ev.loraID(r)
	case posMedium:
		ev.Medium, err = r.optStr()
	case posLoraName:
		// SGLang puts a metadata struct where vLLM has lora_name.
		switch r.kind() {
		case kindMap:
			err = ev.metadata(r)
		case kindArray:
			return r.skip(1)
		default:
			ev.LoraName, err = r.optStr()
		}
	case posExtraKeys:
		ev.ExtraKeys, err = extraKeys(r)
	case posGroup:
		ev.GroupIdx, err = r.optInt(keyGroup)
	case posSpecKind:
		ev.SpecKind, err = r.optStr()
	default:
		return r.skip(1)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", storedKeys[pos], err)
	}
	return nil
}

// metadata reads SGLang's metadata map, of which only cache_salt is kept.
func (ev *BlockStored) metadata(r *reader) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	for range n {
		key, err := r.str()
		if err != nil {
			return err
		}
		if key == keyCacheSalt && r.kind() != kindNil {
			if ev.CacheSalt, err = r.str(); err != nil {
				return fmt.Errorf("%s: %w", keyCacheSalt, err)
			}
			continue
		}
		if err := r.skip(1); err != nil {
			return err
		}
	}
	return nil
}

// parent reads a stored run's parent_block_hash. Null, as vLLM and
// SGLang send it for a sequence's first block, and 0, as some engines
// that imitate vLLM's events do, both mean none: a real block hash of 0
// has a chance of 2^-64, and mistaking one costs a run placed as a
// sequence start, while reading 0 as a hash leaves every sequence such
// an engine reports unplaceable.
func (ev *BlockStored) parent(r *reader) error {
	if r.isNil() {
		ev.ParentHash, ev.HasParent = 0, false
		return nil
	}
	h, err := r.hash()
	ev.ParentHash, ev.HasParent = h, err == nil && h != 0
	return err
}

func (ev *BlockStored) blockSize(r *reader) error {
	v, err := r.intIn(keyBlockSize, 0, math.MaxInt32)
	ev.BlockSize = int(v)
	return err
}

func (ev *BlockStored) loraID(r *reader) error {
	if r.isNil() {
		ev.LoraID = 0
		return nil
	}
	v, err := r.intIn(keyLoraID, math.MinInt64, math.MaxInt64)
	ev.LoraID = v
	return err
}

func extraKeys(r *reader) ([][]byte, error) {
	if r.isNil() {
		return nil, nil
	}
	n, err := r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	if err := r.charge(int64(n) * int64(unsafe.Sizeof([]byte(nil)))); err != nil {
		return nil, err
	}
	keys := make([][]byte, n)
	for i := range keys {
		if r.isNil() {
			continue
		}
		if keys[i], err = r.rawValue(); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// eventType finds the "type" key of the event map at r without consuming it.
func eventType(r reader) (string, error) {
	n, err := r.mapLen()
	if err != nil {
		return "", err
	}
	for range n {
		key, err := r.str()
		if err != nil {
			return "", fmt.Errorf("event key: %w", err)
		}
		if key == keyType {
			return r.str()
		}
		if err := r.skip(1); err != nil {
			return "", err
		}
	}
	return "", errors.New("an event map needs a type")
}

func decodeEventMap(r *reader) (Event, error) {
	typ, err := eventType(*r)
	if err != nil {
		return nil, err
	}
	if !known(typ) {
		return nil, r.skip(0)
	}
	n, err := r.mapLen()
	if err != nil {
		return nil, err
	}
	var st BlockStored
	var seen uint
	for range n {
		key, err := r.str()
		if err != nil {
			return nil, fmt.Errorf("event key: %w", err)
		}
		if key == keyMetadata && typ == TypeBlockStored && r.kind() == kindMap {
			if err := st.metadata(r); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", typ, key, err)
			}
			continue
		}
		pos, ok := storedPos[key]
		if !ok { // "type", read above, and fields this package does not use
			if err := r.skip(1); err != nil {
				return nil, err
			}
			continue
		}
		seen |= 1 << pos
		if err := st.field(r, pos); err != nil {
			return nil, fmt.Errorf("%s: %w", typ, err)
		}
	}
	return build(typ, st, seen)
}
