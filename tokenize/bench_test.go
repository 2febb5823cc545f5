package tokenize

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/bench/prose"
	"github.com/kvroute/kvroute/oai"
)

var (
	benchOnce   sync.Once
	benchPieces []string
)

// realisticPieces returns 16 KiB pieces of Go's own source and docs.
func realisticPieces(b *testing.B) []string {
	benchOnce.Do(func() { benchPieces = pieces16K(goDocs(b, 2<<20)) })
	if len(benchPieces) == 0 {
		b.Skip("no corpus")
	}
	return benchPieces
}

// BenchmarkEncodeCompare runs tiktoken-go and this package's encoder on the
// same 16 KiB pieces of text; compare their MB/s.
func BenchmarkEncodeCompare(b *testing.B) {
	pieces := realisticPieces(b)
	for _, name := range encodings {
		b.Run(name, func(b *testing.B) {
			ref := reference(b, name)
			v := testVocab(b, name)
			b.Run("tiktoken", func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(16 << 10)
				for i := 0; b.Loop(); i++ {
					ref.EncodeOrdinary(pieces[i%len(pieces)])
				}
			})
			b.Run("kvroute", func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(16 << 10)
				var dst []uint32
				for i := 0; b.Loop(); i++ {
					dst = v.appendText(dst[:0], pieces[i%len(pieces)])
				}
			})
		})
	}
}

// BenchmarkEncodeCold measures Tokenizer.Encode on text it has not seen
// (caches disabled), including chunking.
func BenchmarkEncodeCold(b *testing.B) {
	pieces := realisticPieces(b)
	for _, name := range encodings {
		b.Run(name, func(b *testing.B) {
			tk, err := New(Options{Encoding: name, CacheBytes: -1})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(16 << 10)
			var dst []uint32
			for i := 0; b.Loop(); i++ {
				dst = tk.Encode(dst, pieces[i%len(pieces)])
			}
		})
	}
}

// replayConversation returns the 10 requests of a 10-turn conversation:
// request k holds the first k+1 messages (a system prompt shared by every
// conversation, then alternating user and assistant turns of 300-3000
// bytes). tag makes every turn's text unique to the conversation.
func replayConversation(pieces []string, conv int, tag string) []*oai.Request {
	msgs := []oai.Message{{Role: "system", Parts: []oai.Part{{Text: runePrefix(pieces[0], 4000), IsText: true}}}}
	reqs := make([]*oai.Request, 0, 10)
	for turn := 0; turn < 10; turn++ {
		if turn > 0 {
			p := pieces[(conv*7+turn)%len(pieces)]
			n := 300 + (conv*131+turn*977)%2700
			role := "user"
			if turn%2 == 0 {
				role = "assistant"
			}
			msgs = append(msgs, oai.Message{Role: role, Parts: []oai.Part{{Text: tag + runePrefix(p, n), IsText: true}}})
		}
		reqs = append(reqs, &oai.Request{Kind: oai.KindChat, Messages: msgs[:len(msgs):len(msgs)]})
	}
	return reqs
}

// runePrefix returns at most n bytes of s, cut at a rune boundary.
func runePrefix(s string, n int) string {
	if n >= len(s) {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func requestBytes(req *oai.Request) int64 {
	var n int64
	for _, m := range req.Messages {
		for _, p := range m.Parts {
			n += int64(len(p.Text))
		}
	}
	return n
}

// BenchmarkKeyReplay makes the block key of every turn of new 10-turn
// conversations, as a router sees them: each request repeats the whole
// history. With caches only the newest message of each turn is tokenized. One op is one conversation;
// MB/s counts all request text keyed.
func BenchmarkKeyReplay(b *testing.B) {
	pieces := realisticPieces(b)
	for _, mode := range []struct {
		name  string
		cache int64
	}{{"cached", 0}, {"uncached", -1}} {
		b.Run(mode.name, func(b *testing.B) {
			tk, err := New(Options{CacheBytes: mode.cache})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			var dst []uint32
			var bytes int64
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				reqs := replayConversation(pieces, i, fmt.Sprintf("[%d] ", i))
				b.StartTimer()
				for _, req := range reqs {
					dst, _ = tk.Blocks(dst, req)
					bytes += requestBytes(req)
				}
			}
			b.ReportMetric(float64(bytes)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}

// BenchmarkKeyWarm makes the block key of a long conversation seen before.
func BenchmarkKeyWarm(b *testing.B) {
	pieces := realisticPieces(b)
	tk, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	reqs := replayConversation(pieces, 1, "")
	req := reqs[len(reqs)-1]
	dst, _ := tk.Blocks(nil, req)
	b.ReportAllocs()
	b.SetBytes(requestBytes(req))
	for b.Loop() {
		dst, _ = tk.Blocks(dst, req)
	}
}

// BenchmarkKeyAgentTurn makes the block key of the next turn of agent
// conversations: a history of many short messages (tool calls and their
// results) that grows by a call and a result per turn and, past history+40
// messages, is cut back to its last history messages (as agents trim their
// context), which the conversation cache has not seen: the messages since
// the previous cut are tokenized again. One op is one turn.
func BenchmarkKeyAgentTurn(b *testing.B) {
	for _, hist := range []int{20, 200} {
		b.Run(fmt.Sprintf("history=%d", hist), func(b *testing.B) {
			tk, err := New(Options{})
			if err != nil {
				b.Fatal(err)
			}
			const convs = 16
			system := msg("system", text("You are a coding agent."))
			msgs := make([][]oai.Message, convs)
			turns := make([]int, convs)
			next := func(c int) *oai.Request {
				t := turns[c]
				turns[c]++
				msgs[c] = append(msgs[c],
					msg("assistant", text(fmt.Sprintf(`{"tool":"search","args":{"query":"step %d of conversation %d","limit":10}}`, t, c))),
					msg("tool", text(fmt.Sprintf("result %d/%d: the file has 42 lines; the function returns an error when the input is empty.", c, t))))
				if len(msgs[c]) > hist+40 {
					msgs[c] = append([]oai.Message{system}, msgs[c][len(msgs[c])-hist:]...)
				}
				return chat(msgs[c]...)
			}
			for c := range msgs {
				msgs[c] = []oai.Message{system}
				for len(msgs[c]) < hist {
					next(c)
				}
				tk.Blocks(nil, chat(msgs[c]...))
			}
			// Requests are parsed from bodies, as the proxy has them, a
			// batch at a time outside the timer.
			const batch = 256
			reqs := make([]*oai.Request, batch)
			var dst []uint32
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%batch == 0 {
					b.StopTimer()
					for j := range reqs {
						reqs[j] = parsedChat(b, next((i+j)%convs))
					}
					b.StartTimer()
				}
				dst, _ = tk.Blocks(dst, reqs[i%batch])
			}
		})
	}
}

// BenchmarkEncodeProse encodes 16 KiB pieces of plain English prose: words
// separated by single spaces, now and then a capital, a comma, a full stop
// or a number.
func BenchmarkEncodeProse(b *testing.B) {
	rng := rand.New(rand.NewPCG(5, 6))
	pieces := make([]string, 16)
	for i := range pieces {
		var sb strings.Builder
		for sb.Len() < 16<<10 {
			if sb.Len() > 0 {
				sb.WriteByte(' ')
			}
			w := prose.Words[rng.IntN(len(prose.Words))]
			switch rng.IntN(40) {
			case 0:
				w = strings.ToUpper(w[:1]) + w[1:]
			case 1:
				w += ","
			case 2:
				w += "."
			case 3:
				w = strconv.Itoa(rng.IntN(2000))
			}
			sb.WriteString(w)
		}
		pieces[i] = runePrefix(sb.String(), 16<<10)
	}
	for _, name := range encodings {
		b.Run(name, func(b *testing.B) {
			v := testVocab(b, name)
			b.ReportAllocs()
			b.SetBytes(16 << 10)
			var dst []uint32
			for i := 0; b.Loop(); i++ {
				dst = v.appendText(dst[:0], pieces[i%len(pieces)])
			}
		})
	}
}
