package tokenize

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

var encodings = []string{EncodingCL100K, EncodingO200K}

// firstDiff describes where got and want part, with the text around it.
func firstDiff(v *vocab, text string, got, want []uint32) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	off := 0
	for _, id := range want[:i] {
		off += len(v.tokenBytes(id))
	}
	lo, hi := max(0, off-40), min(len(text), off+40)
	return fmt.Sprintf("token %d (byte %d) of %d/%d: got %v want %v near %q",
		i, off, len(got), len(want), got[i:min(len(got), i+5)], want[i:min(len(want), i+5)], text[lo:hi])
}

// tokenBytes returns the bytes of token id.
func (v *vocab) tokenBytes(id uint32) string {
	return v.toks.arena[v.toks.offs[id]:v.toks.offs[id+1]]
}

// decode returns the text of real tokens, skipping synthetic values.
func decode(v *vocab, toks []uint32) string {
	var b strings.Builder
	for _, id := range toks {
		if id < FirstSynthetic {
			b.WriteString(v.tokenBytes(id))
		}
	}
	return b.String()
}

func TestEncoderMatchesTiktokenOnCorpus(t *testing.T) {
	docs := mixedCorpus(t)
	total := 0
	for _, d := range docs {
		total += len(d)
	}
	if total < 1<<20 {
		t.Fatalf("corpus is %d bytes, want at least 1 MiB", total)
	}
	for _, name := range encodings {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := testVocab(t, name)
			var got []uint32
			fails := 0
			for i, d := range docs {
				got = v.appendText(got[:0], d)
				want := referenceTokens(t, name, d)
				if !slices.Equal(got, want) {
					t.Errorf("doc %d: %s", i, firstDiff(v, d, got, want))
					if fails++; fails > 5 {
						t.FailNow()
					}
				}
			}
			t.Logf("%d documents, %d bytes: equal", len(docs), total)
		})
	}
}

// TestEncoderEdgeCases covers each alternative of the pre-tokenizer patterns
// and the invalid UTF-8 handling.
func TestEncoderEdgeCases(t *testing.T) {
	cases := []string{
		"", "a", " ", "\n", "'", "'s", "'S", "'re", "'RE", "'Re", "'ll", "'lL", "'x", "x'", "''s", "don't", "DON'T", "O'Neil's",
		"Hello, world!", "  leading", "trailing  ", "a  b", "a \n b", "a\n\n\nb", "\r\n\r\n", " \r\n x", "\t\tx", "x\t\t",
		"12345678", "1 23 456 7890", "x1y22z333", "١٢٣٤٥", "Ⅻ", "½",
		" ?!", "?!\n\n", " ?/\n/x", "path/to/x", "a//b", "a /\n", "...\r\n",
		"HTMLParser", "getHTTPResponse", "ABCdef", "ABC", "aBC", "ǅemal", "ǅ", "ʰello", "ʰ", "Aʰ",
		"e\u0301", "\u0301", "\u0301abc", "\u0301ABC", "A\u0301B", "x\u0301\u0301\u0301", " \u0301", "\u0301'S",
		"日本語", " 日本語", "한국어", "مرحبا", "हिन्दी", "ภาษาไทย", "🙂", " 🙂🙂", "👩‍👩‍👧‍👦", "🇫🇷",
		"\u00a0x", "\u3000\u3000x", "\u2028", "x\u0085y", "\v\f", "\u200b", "\ufeff",
		"\xff", "a\xffb", "\xed\xa0\x80", "\xc3", "\xe6\x97", "x\xe6\x97\xa5\xe6", "\xf0\x9f\x99", "'\xff", "\xef\xbf\xbd\xff",
		"<|endoftext|>", "<|fim_prefix|>",
		strings.Repeat("a", 200), strings.Repeat("ab", 150), strings.Repeat("日", 100), strings.Repeat(" ", 100), strings.Repeat("🙂", 40),
		strings.Repeat("\n", 50) + "x", strings.Repeat("0", 100), strings.Repeat("!?", 80),
	}
	for _, name := range encodings {
		v := testVocab(t, name)
		for _, s := range cases {
			got := v.appendText(nil, s)
			want := referenceTokens(t, name, s)
			if !slices.Equal(got, want) {
				t.Errorf("%s %q: %s", name, s, firstDiff(v, validText(s), got, want))
			}
			if utf8.ValidString(s) && decode(v, got) != s {
				t.Errorf("%s %q: decodes to %q", name, s, decode(v, got))
			}
		}
	}
}

func FuzzEncodeMatchesTiktoken(f *testing.F) {
	for _, s := range []string{
		"Hello, world! I'm here.\n\n  x  \r\n", "HTMLParser DON'T ÉCOLE naïve e\u0301t", "日本語のテキスト 🙂 12345 ١٢٣ مرحبا",
		"\xff\xfeabc\xed\xa0\x80", " ?/\n/x", "'s'S'RE", "\u0301ABC\u0301abc", "\t\t\u3000\u00a0\n \r\n", "{\"a\": [1, 2.5, \"x\"]}",
		"func main() {\n\tfmt.Println(\"hi\")\n}\n", strings.Repeat("Zz", 60), strings.Repeat("日本", 40),
		"The router's queue was full; it didn't wait for internationalization, caf\u00e9s or naïve HTMLParsers.",
	} {
		f.Add(s)
	}
	for i := 0; i+6 <= len(classAlphabet); i += 6 {
		f.Add(strings.Join(classAlphabet[i:i+6], ""))
	}
	vs := make([]*vocab, len(encodings))
	tks := make([]*Tokenizer, len(encodings))
	for i, name := range encodings {
		vs[i] = testVocab(f, name)
		tks[i] = newTok(f, Options{Encoding: name, ChunkBytes: MinChunkBytes})
		reference(f, name)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if len(s) > 1<<10 {
			// tiktoken-go merges a piece in quadratic time: long inputs
			// (a 3 KB word takes it about a second) stall the fuzzer.
			t.Skip()
		}
		for i, name := range encodings {
			got := vs[i].appendText(nil, s)
			want := referenceTokens(t, name, s)
			if !slices.Equal(got, want) {
				t.Fatalf("%s %q: %s", name, s, firstDiff(vs[i], validText(s), got, want))
			}
			// Chunked and cached encoding still spells the text.
			if got := decode(vs[i], tks[i].Encode(nil, s)); got != validText(s) {
				t.Fatalf("%s %q: Encode decodes to %q", name, s, got)
			}
		}
	})
}

// classAlphabet has a rune of every class the patterns distinguish, and the
// letters and marks around contractions.
var classAlphabet = []string{
	"A", "Z", "a", "z", "s", "S", "t", "T", "r", "R", "e", "E", "v", "V", "m", "M", "l", "L", "d", "D", "'", "'",
	" ", " ", " ", "\t", "\n", "\r", "/", ".", "!", "0", "9", "_", "-", "€", "🙂",
	"É", "é", "ǅ", "ʰ", "ª", "日", "ア", "\u0301", "\u0903", "\u20dd", "٣", "Ⅻ", "½",
	"\u00a0", "\u3000", "\u2028", "\u0085", "\v", "\ufffd", "\xff", "\xe6\x97",
	"𝔘", "𝔲", "𝟘", "\U0001D167", "ſ", "\u212a", "\u0130", "ꞵ", "ᾈ",
}

// TestEncoderRandomClasses compares both encoders on many short strings over
// classAlphabet, which reach every branch of the pre-tokenizers.
func TestEncoderRandomClasses(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	n := 20000
	if testing.Short() {
		n = 2000
	}
	inputs := make([]string, n)
	for i := range inputs {
		var b strings.Builder
		for k := 1 + rng.IntN(24); k > 0; k-- {
			b.WriteString(classAlphabet[rng.IntN(len(classAlphabet))])
		}
		inputs[i] = b.String()
	}
	for _, name := range encodings {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := testVocab(t, name)
			fails := 0
			for _, s := range inputs {
				got := v.appendText(nil, s)
				if want := referenceTokens(t, name, s); !slices.Equal(got, want) {
					t.Errorf("%q: %s", s, firstDiff(v, validText(s), got, want))
					if fails++; fails > 10 {
						t.FailNow()
					}
				}
			}
		})
	}
}

// The eight-bytes-at-once letter scan agrees with the byte classes on
// every byte value at every position of the word.
func TestInRange8MatchesClasses(t *testing.T) {
	initClasses()
	for _, cls := range []uint8{clsL, clsLo, clsUp} {
		lo, hi, fold, ok := asciiLetters(cls)
		if !ok {
			t.Fatalf("class %#x has no ASCII range", cls)
		}
		for b := 0; b < 256; b++ {
			want := b < utf8.RuneSelf && byteClass[b]&cls != 0
			for pos := 0; pos < 8; pos++ {
				word := []byte("zZaAmMqQ")
				word[pos] = byte(b)
				got := inRange8(binary.LittleEndian.Uint64(word), lo, hi, fold)
				if in := got>>(8*pos+7)&1 == 1; in != want {
					t.Fatalf("class %#x byte %#x at %d: in range %v, byte class says %v", cls, b, pos, in, want)
				}
				if got&^(0x80<<(8*pos)) != inRange8(binary.LittleEndian.Uint64([]byte("zZaAmMqQ")), lo, hi, fold)&^(0x80<<(8*pos)) {
					t.Fatalf("class %#x byte %#x at %d changed its neighbours", cls, b, pos)
				}
			}
		}
	}
}

// TestEncoderASCIIWords covers the edges of the ASCII word fast paths
// (wordCL100K, wordO200K): what may precede a word, what may end it, and
// words reaching past the eight bytes the fast paths look at. Each case is
// also tried after other text, and followed by more words, so that the fast
// paths take it whether or not it is near the end of the text (they leave the
// last seven bytes to the general path).
func TestEncoderASCIIWords(t *testing.T) {
	cases := []string{
		// Ends: a non-ASCII letter or mark, an apostrophe, contractions,
		// capitals, digits, the end of the text.
		"word", "word ", " word", " wordé", " word\u0301", " wordΩ", " word日", " word\u00a0", " word🙂",
		" café", " naïve", " résumé", " señora", " façade", " Straße", " coöperate", " Æsir", " Über",
		" don't", " DON'T", " it's", " It'S", " we're", " they've", " I'm", " we'll", " he'd", " x'", " can'", " o'clock",
		" wordX", " wordXy", " Word", " WOrd", " WORD", " wordsABC", " HTMLParser", " Hello", " HeLLo", " A", " a", " I",
		" word1", " word123", " 1word", " wo2rd", " word.", " word,", " word!", " word?", " word;", " word)", " word-",
		// Starts: two spaces, line breaks, tabs, punctuation, an apostrophe,
		// a digit, a non-ASCII byte.
		"  word", "   word", "\nword", "\r\nword", "\n word", "\tword", "\t\tword", " \tword", "(word", "\"word\"", "'word",
		"'sword", "'tis", "'Twas", "-word", "/word", "_word", "1word", "é word", "éword", "\u00a0word", "\u3000word",
		// Lengths around eight bytes, and long words.
		" abcdef", " abcdefg", " abcdefgh", " abcdefghi", "abcdefg", "abcdefgh", "abcdefghi", " Abcdefg", " Abcdefgh",
		" abcdefghijklmnopqrstuvwxyz", " internationalization", " internationalizationé", " internationalization's",
		" internationalizationX", " Internationalization", " INTERNATIONALIZATION", " abcdefgh'll", " abcdefgh\u0301x",
		// Prose.
		"The model answers the question, and the cache keeps the prefix.",
		"the router's queue was full; it didn't wait, and we'll see 42 replicas in 2024.",
	}
	long := strings.Repeat("x", 23)
	for _, name := range encodings {
		v := testVocab(t, name)
		for _, c := range cases {
			const pads = 9
			inputs := make([]string, 0, 5+pads)
			inputs = append(inputs, c, long+c, "ab "+c, c+c, c+"\n"+c+" end")
			for k := range pads {
				inputs = append(inputs, c+" "+strings.Repeat("z", k))
			}
			for _, s := range inputs {
				got := v.appendText(nil, s)
				if want := referenceTokens(t, name, s); !slices.Equal(got, want) {
					t.Errorf("%s %q: %s", name, s, firstDiff(v, s, got, want))
				}
			}
		}
	}
}
