package overhead

import (
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/bench/prose"
)

// A bodyGen produces the request bodies of one connection of the closed
// loop, in order. next's result is valid until the following call.
type bodyGen interface {
	next() []byte
	// answered reports the outcome of the last body's request.
	answered(ok bool)
}

// newBodyGen returns the body generator of scenario for connection worker
// of run (which salts the text so no run sees another's prompts).
func newBodyGen(scenario string, run, worker int, o *Options) bodyGen {
	switch scenario {
	case ScenarioMultiTurn:
		return newMultiTurnGen(run, worker, o.MultiTurnBytes)
	case ScenarioStream:
		return &smallGen{run: run, worker: worker, stream: true, maxTokens: o.StreamEvents}
	case ScenarioManyStreams:
		return &smallGen{run: run, worker: worker, stream: true, maxTokens: o.StreamEvents, gap: o.ManyStreamsGap}
	default:
		return &smallGen{run: run, worker: worker, maxTokens: 16}
	}
}

// smallGen produces one short user message per request, numbered so that
// no two are equal (as real traffic's aren't: a router's caches get no
// free hits).
type smallGen struct {
	run, worker, seq int
	stream           bool
	maxTokens        int
	gap              time.Duration // the pause between events asked of the upstream (gapField); 0: its default
	buf              []byte
}

func (g *smallGen) next() []byte {
	g.seq++
	b := append(g.buf[:0], `{"model":"`+Model+`","messages":[{"role":"user","content":"Hello! Write one friendly sentence about request `...)
	b = strconv.AppendInt(b, int64(g.run), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(g.worker), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(g.seq), 10)
	b = append(b, `."}],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(g.maxTokens), 10)
	if g.stream {
		b = append(b, `,"stream":true`...)
	}
	if g.gap > 0 {
		b = append(b, `,`...)
		b = append(b, gapField...)
		b = strconv.AppendInt(b, g.gap.Microseconds(), 10)
	}
	b = append(b, '}')
	g.buf = b
	return b
}

func (g *smallGen) answered(bool) {}

// Sizes of the messages of a multi-turn conversation, in bytes.
const (
	userMessageBytes      = 512
	assistantMessageBytes = 1024
	systemPrompt          = "You are a helpful assistant. Answer accurately and concisely, and ask a clarifying question when the request is ambiguous."
)

// multiTurnGen plays one conversation after another: each turn appends a
// user message, and once it is answered, the assistant's message; a
// conversation restarts when the next body would exceed limit bytes.
type multiTurnGen struct {
	run, worker, conv int
	limit             int
	rng               *rand.Rand
	msgs              []byte // the messages array's contents, without brackets
	body              []byte
	text              []byte
}

const (
	multiTurnHead = `{"model":"` + Model + `","max_tokens":256,"messages":[`
	multiTurnTail = `]}`
)

func newMultiTurnGen(run, worker, limit int) *multiTurnGen {
	g := &multiTurnGen{run: run, worker: worker, limit: limit}
	g.restart()
	return g
}

// restart begins a new conversation, with its own text.
func (g *multiTurnGen) restart() {
	g.conv++
	g.rng = rand.New(rand.NewPCG(uint64(g.run)<<32|uint64(g.worker), uint64(g.conv)))
	g.msgs = appendMessage(g.msgs[:0], "system", []byte(systemPrompt))
}

func (g *multiTurnGen) next() []byte {
	g.text = appendWords(g.text[:0], g.rng, userMessageBytes)
	// A message adds its text, its JSON frame (under 40 bytes) and a comma.
	if len(multiTurnHead)+len(g.msgs)+len(g.text)+40+len(multiTurnTail) > g.limit {
		g.restart()
	}
	g.msgs = appendMessage(g.msgs, "user", g.text)
	b := append(g.body[:0], multiTurnHead...)
	b = append(b, g.msgs...)
	b = append(b, multiTurnTail...)
	g.body = b
	return b
}

func (g *multiTurnGen) answered(ok bool) {
	if !ok {
		g.restart()
		return
	}
	g.text = appendWords(g.text[:0], g.rng, assistantMessageBytes)
	g.msgs = appendMessage(g.msgs, "assistant", g.text)
}

// appendMessage appends one chat message (text needs no JSON escaping) to
// a messages array's contents.
func appendMessage(b []byte, role string, text []byte) []byte {
	if len(b) > 0 {
		b = append(b, ',')
	}
	b = append(b, `{"role":"`...)
	b = append(b, role...)
	b = append(b, `","content":"`...)
	b = append(b, text...)
	return append(b, `"}`...)
}

// appendWords appends words drawn from rng until at least n bytes were added.
func appendWords(b []byte, rng *rand.Rand, n int) []byte {
	start := len(b)
	for len(b)-start < n {
		if len(b) > start {
			b = append(b, ' ')
		}
		b = append(b, prose.Words[rng.IntN(len(prose.Words))]...)
	}
	return b
}
