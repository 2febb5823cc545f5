package tokenize

import (
	"fmt"
	"math/bits"
	"sync"

	loader "github.com/pkoukk/tiktoken-go-loader"
)

// Encoding names accepted by Options.Encoding.
const (
	EncodingCL100K = "cl100k_base" // GPT-3.5/GPT-4 family; the default
	EncodingO200K  = "o200k_base"  // GPT-4o family
)

// bpeFileURL names each encoding's rank file the way tiktoken-go does. The
// offline loader keeps only the base name and reads the file embedded in the
// loader module, so nothing is fetched.
var bpeFileURL = map[string]string{
	EncodingCL100K: "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
	EncodingO200K:  "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
}

const (
	// noRank marks an adjacent pair that does not merge.
	noRank = ^uint32(0)
	// rankBits bounds every rank (token ID) of the supported encodings.
	rankBits = 18
	// valBits is the width of the value field of a packed pair-table slot.
	valBits = 20
)

// vocab is one encoding's immutable vocabulary, shared by every Tokenizer of
// that encoding in the process. It is safe for concurrent use.
type vocab struct {
	name string
	// o200k selects the o200k_base pre-tokenizer; cl100k_base otherwise.
	o200k bool
	// toks maps each token's bytes to its rank, which is its token ID.
	toks tokTable
	// byteTok is the token of each single byte.
	byteTok [256]uint32
	// bytePair is the token of each two-byte string, or noRank.
	bytePair *[256 * 256]uint32
	// pairs is an open-addressing table from a pair of adjacent tokens (a, b)
	// to the rank of the token spelled bytes(a)+bytes(b), if there is one.
	// Each slot packs key<<valBits | (rank+1); 0 is empty.
	pairs     []uint64
	pairMask  uint64
	pairShift uint
	// size is one more than the largest rank.
	size int
}

var (
	vocabMu    sync.Mutex
	vocabCache = map[string]*vocab{}
)

// loadVocab returns the shared vocabulary of the named encoding, building it
// on first use from the BPE file embedded in tiktoken-go-loader.
func loadVocab(name string) (*vocab, error) {
	url, ok := bpeFileURL[name]
	if !ok {
		return nil, fmt.Errorf("tokenize: unknown encoding %q (want %q or %q)", name, EncodingCL100K, EncodingO200K)
	}
	vocabMu.Lock()
	defer vocabMu.Unlock()
	if v := vocabCache[name]; v != nil {
		return v, nil
	}
	ranks, err := loader.NewOfflineLoader().LoadTiktokenBpe(url)
	if err != nil {
		return nil, fmt.Errorf("tokenize: load %s ranks: %w", name, err)
	}
	v, err := buildVocab(name, ranks)
	if err != nil {
		return nil, err
	}
	vocabCache[name] = v
	return v, nil
}

// buildVocab derives the lookup tables from a rank map.
func buildVocab(name string, ranks map[string]int) (*vocab, error) {
	v := &vocab{
		name:  name,
		o200k: name == EncodingO200K,
	}
	// The loader's map is kept only while building; the tables replace it.
	rk := make(map[string]uint32, len(ranks))
	seen := make([]bool, 1<<rankBits)
	for tok, r := range ranks {
		if r < 0 || r >= 1<<rankBits || seen[r] {
			return nil, fmt.Errorf("tokenize: %s: rank %d out of range or repeated", name, r)
		}
		seen[r] = true
		rk[tok] = uint32(r)
		v.size = max(v.size, r+1)
	}
	if v.size != len(rk) {
		return nil, fmt.Errorf("tokenize: %s: ranks are not 0..%d", name, len(rk)-1)
	}
	for b := 0; b < 256; b++ {
		r, ok := rk[string([]byte{byte(b)})]
		if !ok {
			return nil, fmt.Errorf("tokenize: %s: byte %#x has no token", name, b)
		}
		v.byteTok[b] = r
	}
	v.bytePair = new([256 * 256]uint32)
	for i := range v.bytePair {
		r, ok := rk[string([]byte{byte(i >> 8), byte(i)})]
		if !ok {
			r = noRank
		}
		v.bytePair[i] = r
	}
	v.toks = newTokTable(rk, v.size)

	// Every part of a piece during byte-pair merging is a token, so a merge of
	// two parts exists exactly when some split of a token spells the pair.
	var keys []uint64
	var vals []uint32
	for tok, r := range rk {
		for i := 1; i < len(tok); i++ {
			a, ok := rk[tok[:i]]
			if !ok {
				continue
			}
			b, ok := rk[tok[i:]]
			if !ok {
				continue
			}
			keys = append(keys, uint64(a)<<rankBits|uint64(b))
			vals = append(vals, r)
		}
	}
	slots := 1 << bits.Len(uint(len(keys)*2))
	v.pairs = make([]uint64, slots)
	v.pairMask = uint64(slots - 1)
	v.pairShift = uint(64 - bits.TrailingZeros(uint(slots)))
	for i, k := range keys {
		h := (k * 0x9E3779B97F4A7C15) >> v.pairShift
		for v.pairs[h] != 0 {
			if v.pairs[h]>>valBits == k {
				// Two splits of different tokens cannot spell the same pair.
				return nil, fmt.Errorf("tokenize: %s: duplicate pair", name)
			}
			h = (h + 1) & v.pairMask
		}
		v.pairs[h] = k<<valBits | uint64(vals[i]+1)
	}
	return v, nil
}

// pair returns the rank of the token spelled by tokens a then b, or noRank.
func (v *vocab) pair(a, b uint32) uint32 {
	k := uint64(a)<<rankBits | uint64(b)
	h := (k * 0x9E3779B97F4A7C15) >> v.pairShift
	for {
		e := v.pairs[h]
		if e>>valBits == k && e != 0 {
			return uint32(e&(1<<valBits-1)) - 1
		}
		if e == 0 {
			return noRank
		}
		h = (h + 1) & v.pairMask
	}
}
