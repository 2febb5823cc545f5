package kvevents

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Encoding is one of the two wire forms of events.
type Encoding int

const (
	// Tagged is vLLM's encoding since mid-2026: the batch and each event
	// are maps, events tagged by a "type" key; optional fields left at
	// their defaults are omitted.
	Tagged Encoding = iota
	// Positional is the older vLLM encoding and SGLang's: the batch and
	// each event are arrays, events led by their type tag.
	Positional
)

// String names the encoding as configuration spells it.
func (e Encoding) String() string {
	switch e {
	case Tagged:
		return "tagged"
	case Positional:
		return "positional"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// Encode writes b as vLLM sends it in encoding enc, and a BlockStored's
// CacheSalt as SGLang does (a metadata map, which the positional encoding
// has in lora_name's place: there it is left out of an event with a
// LoRA name). Decode(Encode(b, enc)) gives b back (with Skipped 0) for
// either encoding.
func Encode(b Batch, enc Encoding) ([]byte, error) {
	if enc != Tagged && enc != Positional {
		return nil, fmt.Errorf("kvevents: unknown encoding %v", enc)
	}
	var buf bytes.Buffer
	w := &writer{e: msgpack.NewEncoder(&buf), tagged: enc == Tagged}
	if w.tagged {
		w.mapLen(3)
		w.str(keyTS)
		w.float(b.TS)
		w.str(keyEvents)
	} else {
		w.arrayLen(3)
		w.float(b.TS)
	}
	w.arrayLen(len(b.Events))
	for _, ev := range b.Events {
		w.event(ev)
	}
	if w.tagged {
		w.str(keyDPRank)
	}
	w.int(int64(b.DPRank))
	if w.err != nil {
		return nil, w.err
	}
	return buf.Bytes(), nil
}

// writer wraps msgpack.Encoder, keeping its first error.
type writer struct {
	e      *msgpack.Encoder
	tagged bool
	err    error
}

func (w *writer) keep(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *writer) mapLen(n int)    { w.keep(w.e.EncodeMapLen(n)) }
func (w *writer) arrayLen(n int)  { w.keep(w.e.EncodeArrayLen(n)) }
func (w *writer) str(s string)    { w.keep(w.e.EncodeString(s)) }
func (w *writer) float(f float64) { w.keep(w.e.EncodeFloat64(f)) }
func (w *writer) int(i int64)     { w.keep(w.e.EncodeInt(i)) }
func (w *writer) uint(u uint64)   { w.keep(w.e.EncodeUint(u)) }
func (w *writer) null()           { w.keep(w.e.EncodeNil()) }

// raw writes p, which must be one whole msgpack value.
func (w *writer) raw(p []byte) {
	r := reader{b: p}
	if err := r.skip(0); err != nil || r.left() != 0 {
		w.keep(fmt.Errorf("kvevents: an extra key is not one msgpack value: %x", p))
		return
	}
	w.keep(w.e.Encode(msgpack.RawMessage(p)))
}

// key writes a field's name, in the tagged encoding.
func (w *writer) key(name string) {
	if w.tagged {
		w.str(name)
	}
}

// optStr writes s, or nil for "" (the engines' None).
func (w *writer) optStr(s string) {
	if s == "" {
		w.null()
		return
	}
	w.str(s)
}

func (w *writer) hashes(hs []uint64) {
	w.arrayLen(len(hs))
	for _, h := range hs {
		w.uint(h)
	}
}

// field is one named value of an event, written as a map entry or an array
// element.
type field struct {
	name  string
	write func()
}

// fields writes an event: in the tagged encoding a map with the type and
// the fields; in the positional one an array of the type and the fields.
func (w *writer) fields(typ string, fs []field) {
	if w.tagged {
		w.mapLen(len(fs) + 1)
		w.str(keyType)
	} else {
		w.arrayLen(len(fs) + 1)
	}
	w.str(typ)
	for _, f := range fs {
		w.key(f.name)
		f.write()
	}
}

func (w *writer) event(ev Event) {
	switch ev := ev.(type) {
	case BlockStored:
		w.fields(TypeBlockStored, w.storedFields(ev))
	case BlockRemoved:
		w.fields(TypeBlockRemoved, w.removedFields(ev))
	case AllBlocksCleared:
		w.fields(TypeAllBlocksCleared, nil)
	default:
		w.keep(fmt.Errorf("kvevents: cannot encode event %T", ev))
	}
}

// storedFields lists BlockStored's fields in vLLM's order. Fields without a
// default (through lora_name) are always sent; extra_keys and
// kv_cache_spec_kind only when set, as vLLM omits them at their default.
// group_idx is always sent, as vLLM does for every group.
func (w *writer) storedFields(ev BlockStored) []field {
	fs := []field{
		{keyHashes, func() { w.hashes(ev.BlockHashes) }},
		{keyParent, func() {
			if ev.HasParent {
				w.uint(ev.ParentHash)
			} else {
				w.null()
			}
		}},
		{keyTokens, func() {
			w.arrayLen(len(ev.TokenIDs))
			for _, t := range ev.TokenIDs {
				w.uint(uint64(t))
			}
		}},
		{keyBlockSize, func() { w.int(int64(ev.BlockSize)) }},
		{keyLoraID, func() {
			if ev.LoraID == 0 {
				w.null()
			} else {
				w.int(ev.LoraID)
			}
		}},
		{keyMedium, func() { w.optStr(ev.Medium) }},
		{keyLoraName, func() { w.optStr(ev.LoraName) }},
	}
	if ev.CacheSalt != "" {
		meta := field{keyMetadata, func() {
			w.mapLen(1)
			w.str(keyCacheSalt)
			w.str(ev.CacheSalt)
		}}
		switch {
		case w.tagged:
			fs = append(fs, meta)
		case ev.LoraName == "": // SGLang's place for it
			fs[len(fs)-1] = meta
		}
	}
	extra := field{keyExtraKeys, func() {
		w.arrayLen(len(ev.ExtraKeys))
		for _, k := range ev.ExtraKeys {
			if k == nil {
				w.null()
			} else {
				w.raw(k)
			}
		}
	}}
	switch {
	case len(ev.ExtraKeys) > 0:
		fs = append(fs, extra)
	case !w.tagged: // positions are fixed: a placeholder before group_idx
		fs = append(fs, field{keyExtraKeys, w.null})
	}
	fs = append(fs, field{keyGroup, func() { w.int(int64(ev.GroupIdx)) }})
	if ev.SpecKind != "" {
		fs = append(fs, field{keySpecKind, func() { w.str(ev.SpecKind) }})
	}
	return fs
}

func (w *writer) removedFields(ev BlockRemoved) []field {
	return []field{
		{keyHashes, func() { w.hashes(ev.BlockHashes) }},
		{keyMedium, func() { w.optStr(ev.Medium) }},
		{keyGroup, func() { w.int(int64(ev.GroupIdx)) }},
	}
}
