package load

import (
	"strings"
	"unicode/utf8"
)

// BytesPerToken is the size of one synthetic token: every vocabulary word
// is a space and three letters. It matches bench/sim's token rule (4 bytes
// per token), and each word is also a single cl100k_base token.
const BytesPerToken = 4

// MooncakeBlockTokens is the block size of the Mooncake trace's hash IDs.
const MooncakeBlockTokens = 512

// MooncakeBlockBytes is the length of the synthetic text of one Mooncake
// block: 512 tokens of 4 bytes.
const MooncakeBlockBytes = MooncakeBlockTokens * BytesPerToken

// vocab holds 128 common English three-letter words with a leading space;
// a word index is 7 bits of PRNG output.
var vocab = [128]string{
	" the", " and", " for", " you", " are", " not", " but", " one",
	" all", " can", " her", " was", " its", " new", " now", " way",
	" who", " out", " day", " get", " has", " him", " his", " how",
	" man", " old", " see", " two", " use", " any", " boy", " did",
	" few", " got", " let", " put", " say", " she", " too", " try",
	" why", " yes", " yet", " ask", " big", " buy", " car", " cut",
	" end", " eye", " far", " fun", " job", " kid", " law", " lot",
	" low", " own", " pay", " run", " set", " sit", " six", " ten",
	" top", " war", " win", " arm", " bad", " bed", " box", " dog",
	" eat", " egg", " fit", " fly", " gas", " hit", " hot", " key",
	" lay", " leg", " lie", " map", " mix", " oil", " pen", " pop",
	" red", " sea", " sky", " son", " sun", " tax", " tea", " toy",
	" air", " art", " bag", " bit", " bus", " cap", " cat", " cup",
	" dad", " dry", " ear", " fan", " fat", " fee", " fix", " gap",
	" hat", " ice", " jet", " lab", " mad", " net", " odd", " pet",
	" pie", " raw", " row", " sad", " tip", " age", " act", " add",
}

// splitmix64 is a small, fast, well-mixed PRNG (Steele, Lea & Flood 2014).
// Its output stream is fixed by this code, so workloads are reproducible
// across Go releases.
type splitmix64 struct{ s uint64 }

func (r *splitmix64) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float64 returns a uniform value in [0, 1).
func (r *splitmix64) float64() float64 {
	return float64(r.next()>>11) / (1 << 53)
}

// intn returns a uniform value in [0, n); n must be positive.
func (r *splitmix64) intn(n int) int {
	return int(r.next() % uint64(n))
}

// mix hashes a sequence of values into one seed.
func mix(vs ...uint64) uint64 {
	h := uint64(0x6b76726f7574656c)
	for _, v := range vs {
		r := splitmix64{h ^ v}
		h = r.next()
	}
	return h
}

// strSeed hashes a string (a namespace tag) into a seed (FNV-1a).
func strSeed(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// appendSynth appends n bytes of the synthetic text stream of seed to dst.
// The stream is a sequence of 4-byte vocabulary words; a shorter n gives a
// prefix of a longer one, so a truncated block is a prefix of the full
// block.
func appendSynth(dst []byte, seed uint64, n int) []byte {
	r := splitmix64{seed}
	var bits uint64
	left := 0
	for n > 0 {
		if left == 0 {
			bits, left = r.next(), 9 // 9 words of 7 bits from 64 bits
		}
		w := vocab[bits&127]
		bits >>= 7
		left--
		if n < len(w) {
			w = w[:n]
		}
		dst = append(dst, w...)
		n -= len(w)
	}
	return dst
}

// synthText returns tokens tokens (4*tokens bytes) of the synthetic text
// stream of seed.
func synthText(seed uint64, tokens int) string {
	if tokens <= 0 {
		return ""
	}
	return string(appendSynth(make([]byte, 0, tokens*BytesPerToken), seed, tokens*BytesPerToken))
}

// mooncakeSeed is the text seed of a Mooncake hash ID.
func mooncakeSeed(id uint64) uint64 { return mix(strSeed("mooncake-block"), id) }

// MooncakeBlockText returns the synthetic text of the Mooncake block with
// hash ID id: exactly MooncakeBlockBytes bytes, a function of id alone.
func MooncakeBlockText(id uint64) string {
	return string(appendSynth(make([]byte, 0, MooncakeBlockBytes), mooncakeSeed(id), MooncakeBlockBytes))
}

// appendMooncakePrompt appends the prompt text of a Mooncake request: the
// texts of its blocks, concatenated, cut to tokens*BytesPerToken bytes.
func appendMooncakePrompt(dst []byte, blocks []uint64, tokens int) []byte {
	n := tokens * BytesPerToken
	for _, id := range blocks {
		if n <= 0 {
			break
		}
		k := min(n, MooncakeBlockBytes)
		dst = appendSynth(dst, mooncakeSeed(id), k)
		n -= k
	}
	return dst
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string literal. Invalid UTF-8 is
// replaced by U+FFFD, as encoding/json does.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\u202`...)
			dst = append(dst, hexDigits[r&15])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// renderChat renders messages canonically, as bench/sim does: for every
// message "<|role|>" content "\n".
func renderChat(msgs []Message) string {
	var b strings.Builder
	n := 0
	for _, m := range msgs {
		n += len(m.Role) + len(m.Content) + 5
	}
	b.Grow(n)
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	return b.String()
}

// tokensOf is the token count of n bytes of text under the 4-bytes-per-token
// rule.
func tokensOf(n int) int { return (n + BytesPerToken - 1) / BytesPerToken }
