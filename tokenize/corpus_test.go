package tokenize

import (
	"encoding/json"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
)

// goroot is Go's root directory as `go env GOROOT` reports it, or "" when
// there is no go command.
var goroot = sync.OnceValue(func() string {
	out, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
})

// goDocs returns up to maxBytes of Go's own source and documentation from
// GOROOT as separate documents, in a fixed order. It skips the test when
// GOROOT is unknown or has no sources.
func goDocs(tb testing.TB, maxBytes int) []string {
	tb.Helper()
	root := goroot()
	if root == "" {
		tb.Skip("no go command to locate GOROOT")
	}
	var paths []string
	for _, dir := range []string{"doc", "src"} {
		base := filepath.Join(root, dir)
		_ = filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.IsDir() {
				if d.Name() == "testdata" || d.Name() == "vendor" {
					return filepath.SkipDir
				}
				return nil
			}
			switch filepath.Ext(p) {
			case ".go", ".html", ".md", ".s", ".txt":
				paths = append(paths, p)
			}
			return nil
		})
	}
	if len(paths) == 0 {
		tb.Skipf("no Go sources under %s", root)
	}
	sort.Strings(paths)
	// Take files spread over the whole tree rather than the first ones.
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(paths), func(i, j int) { paths[i], paths[j] = paths[j], paths[i] })
	var docs []string
	total := 0
	for _, p := range paths {
		if total >= maxBytes {
			break
		}
		b, err := os.ReadFile(p)
		if err != nil || len(b) == 0 {
			continue
		}
		if len(b) > 64<<10 {
			b = b[:64<<10]
		}
		docs = append(docs, string(b))
		total += len(b)
	}
	return docs
}

// Pools of non-ASCII and tricky text for generated documents.
var (
	genWords = []string{
		// CJK, kana, hangul
		"日本語のテキスト", "中文文本处理", "東京都", "한국어 문장입니다", "カタカナ", "ひらがな", "漢字かな交じり文",
		// accents, precomposed and combining
		"naïve", "café", "Ångström", "crème brûlée", "e\u0301te\u0301", "n\u0303", "a\u0308\u0301", "ÉCOLE", "ǅemal", "ǈ", "ǋ",
		// RTL
		"مرحبا بالعالم", "שלום עולם", "العَرَبِيَّة", "\u200fRTL\u200e",
		// Indic and Thai, with marks
		"हिन्दी", "भारत", "ภาษาไทย", "தமிழ்", "ಕನ್ನಡ",
		// Cyrillic, Greek, modifier letters
		"Привет", "МОСКВА", "Ελληνικά", "ΑΘΗΝΑ", "ʰʲʷ", "ᵃᵇᶜ", "ᴬᴮ",
		// emoji, ZWJ sequences, flags, skin tones, variation selectors
		"🙂", "👩‍👩‍👧‍👦", "🇫🇷", "👍🏽", "❤️", "☃", "🏳️‍🌈", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝟘𝟙𝟚",
		// numbers of every kind
		"12345678", "3.14159", "1,000,000", "١٢٣٤٥", "۱۲۳", "१२३", "１２３４", "²³", "½¾", "Ⅻ", "ⅷ", "〇", "𝟕",
		// contractions, straight and curly, any case
		"I'm", "you'RE", "they'Ve", "DON'T", "we'll", "she'D", "it's", "IT'S", "’s", "O'Neil", "'ll", "'LL", "'Re",
		// camel case and code-ish
		"HTMLParser", "getHTTPResponseCode", "XMLHttpRequest", "snake_case_name", "kebab-case", "path/to/file.go", "//", "/*", "*/", "://",
		// punctuation runs
		"...", "?!", "—", "–", "«»", "“quoted”", "(parens)", "[brackets]", "{braces}", "<tag/>", "&amp;", "#!", "@@", "$$", "¿¡",
		// odd code points
		"\u00ad", "\u200b", "\u2060", "\ufeff", "\u0300", "\u034f", "\ufffd", "\U0001F3FB", "\u00a0", "\u3000", "\u2028", "\u2029", "\u0085",
	}
	genSpaces = []string{
		" ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ", " \r\n ", "\t\n", "\n\t",
		"\u00a0", "\u3000", "\u2003", "\v", "\f", "\r", "\n\n\n   ", "    \n", "\u0085", "\u2028", " /\n", "/\n", "\n/",
	}
)

// genDoc returns n bytes or so of generated mixed-script text.
func genDoc(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 99))
	var b strings.Builder
	for b.Len() < n {
		w := genWords[rng.IntN(len(genWords))]
		switch rng.IntN(10) {
		case 0:
			w = strings.ToUpper(w)
		case 1:
			w = strings.Repeat(w, 1+rng.IntN(4))
		}
		b.WriteString(w)
		if rng.IntN(4) != 0 {
			b.WriteString(genSpaces[rng.IntN(len(genSpaces))])
		}
	}
	return b.String()
}

// genJSON returns n bytes or so of JSON built from words of docs.
func genJSON(seed uint64, n int, words []string) string {
	rng := rand.New(rand.NewPCG(seed, 7))
	var b strings.Builder
	for b.Len() < n {
		obj := map[string]any{}
		for i := 0; i < 2+rng.IntN(6); i++ {
			k := words[rng.IntN(len(words))]
			switch rng.IntN(5) {
			case 0:
				obj[k] = rng.IntN(1 << 20)
			case 1:
				obj[k] = rng.Float64() * 1000
			case 2:
				obj[k] = []string{words[rng.IntN(len(words))], genWords[rng.IntN(len(genWords))]}
			default:
				obj[k] = words[rng.IntN(len(words))] + " " + genWords[rng.IntN(len(genWords))]
			}
		}
		var out []byte
		if rng.IntN(2) == 0 {
			out, _ = json.Marshal(obj)
		} else {
			out, _ = json.MarshalIndent(obj, "", "  ")
		}
		b.Write(out)
		b.WriteString("\n")
	}
	return b.String()
}

var (
	corpusOnce sync.Once
	corpusDocs []string
)

// mixedCorpus returns about 1.2 MB of documents: Go source and docs, JSON,
// and generated non-ASCII text.
func mixedCorpus(tb testing.TB) []string {
	tb.Helper()
	corpusOnce.Do(func() {
		docs := goDocs(tb, 800<<10)
		words := strings.Fields(strings.Join(docs[:min(len(docs), 20)], " "))
		corpusDocs = append(corpusDocs, docs...)
		for i := 0; i < 10; i++ {
			corpusDocs = append(corpusDocs, genJSON(uint64(i), 10<<10, words))
		}
		for i := 0; i < 30; i++ {
			corpusDocs = append(corpusDocs, genDoc(uint64(i), 10<<10))
		}
	})
	if len(corpusDocs) == 0 {
		tb.Skip("no corpus")
	}
	return corpusDocs
}

// pieces16K cuts the concatenated docs into 16 KiB pieces (at rune
// boundaries).
func pieces16K(docs []string) []string {
	all := strings.Join(docs, "\n")
	var out []string
	for len(all) > 0 {
		n := min(16<<10, len(all))
		for n < len(all) && n > 0 && all[n]&0xC0 == 0x80 {
			n--
		}
		out = append(out, all[:n])
		all = all[n:]
	}
	return out
}
