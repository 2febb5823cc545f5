package kvevents

// BlockKeys is what a block's extra keys (an entry of
// BlockStored.ExtraKeys) say to a router: the cache salt mixed into its
// hash, and whether anything else than the salt and the LoRA adapter's
// name was (multimodal hashes), in which case its tokens alone do not
// say what it holds.
type BlockKeys struct {
	// Salt is the request's cache_salt, "" for none.
	Salt string
	// Other is whether the keys hold inputs other than the salt and the
	// adapter's name, or could not be read.
	Other bool
}

// ReadBlockKeys reads the extra keys raw of one block of an event whose
// adapter is lora ("" for none). vLLM mixes a request's cache_salt into
// the hash of its first block only (first: the block starts its
// sequence). The keys are a msgpack array whose entries are untyped: the
// salt as a bare string or a ("cache_salt", salt) pair, the adapter as its
// bare name or a ("lora", name) pair; a lone pair may come without the
// array around it. On a first block one bare string
// other than the adapter's name is the salt; any other entry, or a second
// such string, is Other.
func ReadBlockKeys(raw []byte, lora string, first bool) BlockKeys {
	var k BlockKeys
	if len(raw) == 0 {
		return k
	}
	r := &reader{b: raw}
	n := 1
	if r.kind() == kindArray && !tagged(*r) {
		var err error
		if n, err = r.arrayLen(); err != nil {
			return BlockKeys{Other: true}
		}
	}
	for range n {
		tag, val, ok := blockKey(r)
		switch {
		case !ok:
			return BlockKeys{Other: true}
		case tag == "lora" && val == lora && lora != "",
			tag == "" && val == lora && lora != "":
		case first && k.Salt == "" && (tag == keyCacheSalt || tag == "") && val != "":
			k.Salt = val
		default:
			k.Other = true
		}
	}
	if r.left() != 0 {
		k.Other = true
	}
	return k
}

// tagged reports whether the array at r is itself one tagged entry
// ("cache_salt", salt) or ("lora", name), sent without the array of
// entries around it.
func tagged(r reader) bool {
	n, err := r.arrayLen()
	if err != nil || n != 2 || r.kind() != kindString {
		return false
	}
	tag, err := r.str()
	return err == nil && (tag == keyCacheSalt || tag == "lora") && r.kind() == kindString
}

// blockKey reads one entry of a block's extra keys: a bare string (tag "")
// or a pair (tag, string). ok is false for anything else.
func blockKey(r *reader) (tag, val string, ok bool) {
	switch r.kind() {
	case kindString:
		v, err := r.str()
		return "", v, err == nil
	case kindArray:
		n, err := r.arrayLen()
		if err != nil || n != 2 || r.kind() != kindString {
			return "", "", false
		}
		if tag, err = r.str(); err != nil || r.kind() != kindString {
			return "", "", false
		}
		val, err = r.str()
		return tag, val, err == nil && tag != ""
	}
	return "", "", false
}
