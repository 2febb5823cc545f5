// Package flood pushes prompts through kvroute's routing path (parse,
// tokenize, match, score, record) without any network: a stream of unique
// prompts, or a full replay of the Mooncake trace. It reports whether the
// prefix tree and the token caches held their bounds, the tree's bytes per
// stored token, and the process's resident memory.
package flood

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/bench/load"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/server"
	"github.com/kvroute/kvroute/tokenize"
)

// Options sizes a flood.
type Options struct {
	Bytes        int64 // total prompt bytes to send; default 1 GiB
	PromptBytes  int   // bytes per prompt; default 64 KiB
	Replicas     int   // default 8
	TreeMaxBytes int64 // index.tree_max_bytes; default 64 MiB
	CacheBytes   int64 // tokenizer.cache_bytes; default 64 MiB
	Progress     func(done, total int64)
}

// Report is the outcome of a flood.
type Report struct {
	Requests       int     `json:"requests"`
	PromptBytes    int64   `json:"prompt_bytes"`
	Seconds        float64 `json:"seconds"`
	TreeBytesMax   int64   `json:"tree_bytes_max"` // largest tree estimate seen
	TreeBound      int64   `json:"tree_bound"`
	CacheBytesMax  int64   `json:"cache_bytes_max"` // largest token-cache total seen
	CacheBound     int64   `json:"cache_bound"`
	HeapInuseMax   uint64  `json:"heap_inuse_max"`
	PeakRSS        int64   `json:"peak_rss_bytes"` // VmHWM of this process; 0 when unknown
	WithinBounds   bool    `json:"within_bounds"`
	TreeTokens     int64   `json:"tree_tokens"`
	BytesPerToken  float64 `json:"tree_bytes_per_token"`
	BaselineRSS    int64   `json:"baseline_rss_bytes"` // resident memory before the flood
	TokenizerLabel string  `json:"tokenizer"`
}

func (o *Options) defaults() {
	if o.Bytes <= 0 {
		o.Bytes = 1 << 30
	}
	if o.PromptBytes <= 0 {
		o.PromptBytes = 64 << 10
	}
	if o.Replicas <= 0 {
		o.Replicas = 8
	}
	if o.TreeMaxBytes <= 0 {
		o.TreeMaxBytes = 64 << 20
	}
	if o.CacheBytes <= 0 {
		o.CacheBytes = 64 << 20
	}
}

var vocab = strings.Fields(`time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car city`)

// prompt writes a unique prompt of about n bytes seeded by i.
func prompt(sb *strings.Builder, i uint64, n int) {
	sb.Reset()
	r := rand.New(rand.NewPCG(i, i^0x9e3779b97f4a7c15))
	sb.WriteString(strconv.FormatUint(i, 36))
	for sb.Len() < n {
		sb.WriteByte(' ')
		sb.WriteString(vocab[r.IntN(len(vocab))])
		if r.IntN(9) == 0 {
			sb.WriteString(strconv.Itoa(r.IntN(100000)))
		}
	}
}

// Run floods a kvroute routing path built from a default configuration
// with unique prompts, each a user message behind the same system message.
func Run(o Options) (*Report, error) {
	o.defaults()
	var sb strings.Builder
	var i uint64
	return drive(o, func() ([]map[string]string, bool) {
		prompt(&sb, i, o.PromptBytes)
		i++
		return []map[string]string{
			message("system", "You are a helpful assistant."),
			message("user", sb.String()),
		}, true
	})
}

// message is a chat message as drive sends it: its role and content.
func message(role, content string) map[string]string {
	return map[string]string{"role": role, "content": content}
}

// RunTrace replays every request of the Mooncake conversation trace at path
// (text synthesized per block hash, as the load generator does) through the
// routing path, in order, as fast as it goes.
func RunTrace(path string, o Options) (*Report, error) {
	o.defaults()
	w, err := load.Mooncake(path, load.MooncakeOptions{})
	if err != nil {
		return nil, err
	}
	o.Bytes = 1 << 62
	next := 0
	return drive(o, func() ([]map[string]string, bool) {
		if next >= len(w.Requests) {
			return nil, false
		}
		var msgs []map[string]string
		for _, m := range w.Requests[next].Chat() {
			msgs = append(msgs, message(m.Role, m.Content))
		}
		next++
		return msgs, true
	})
}

// floodInFlight is how many requests a flood keeps unanswered: their
// prefill counts as pending on their replicas, spreading new prompts over
// the fleet as load would.
const floodInFlight = 64

func drive(o Options, next func() ([]map[string]string, bool)) (*Report, error) {
	cfg := config.Default()
	cfg.Index.TreeMaxBytes = o.TreeMaxBytes
	cfg.Tokenizer.CacheBytes = o.CacheBytes
	for i := 0; i < o.Replicas; i++ {
		cfg.Backends = append(cfg.Backends, config.Backend{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 22000+i), Engine: "vllm"})
	}
	srv, err := server.Build(cfg, zap.NewNop())
	if err != nil {
		return nil, err
	}
	tok, ix := srv.Tokenizer(), srv.Index()
	var bufs oai.Buffers
	runtime.GC()
	rep := &Report{TreeBound: o.TreeMaxBytes, CacheBound: o.CacheBytes, BaselineRSS: rss("VmRSS"), TokenizerLabel: cfg.Tokenizer.Encoding}
	var inflight [floodInFlight]router.Decision
	start := time.Now()
	for rep.PromptBytes < o.Bytes {
		msgs, ok := next()
		if !ok {
			break
		}
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		dec, err := srv.Decide(&bufs, oai.KindChat, body, nil)
		if err != nil {
			return nil, err
		}
		// The prefill of the request floodInFlight requests back is done:
		// the decisions see a fleet working on that many at a time.
		slot := &inflight[rep.Requests%floodInFlight]
		slot.Started()
		*slot = dec
		rep.Requests++
		for _, m := range msgs {
			rep.PromptBytes += int64(len(m["content"]))
		}
		if rep.Requests%64 == 0 {
			sample(rep, ix, tok)
			if o.Progress != nil {
				o.Progress(rep.PromptBytes, o.Bytes)
			}
		}
	}
	sample(rep, ix, tok)
	rep.Seconds = time.Since(start).Seconds()
	rep.PeakRSS = rss("VmHWM")
	if ix != nil {
		st := ix.Stats()
		rep.TreeTokens = st.Tokens
		if st.Tokens > 0 {
			rep.BytesPerToken = float64(st.Bytes) / float64(st.Tokens)
		}
	}
	rep.WithinBounds = rep.TreeBytesMax <= rep.TreeBound && rep.CacheBytesMax <= rep.CacheBound
	return rep, nil
}

func sample(rep *Report, ix *index.Index, tok *tokenize.Tokenizer) {
	if ix != nil {
		rep.TreeBytesMax = max(rep.TreeBytesMax, ix.Stats().Bytes)
	}
	if tok != nil {
		s := tok.Stats()
		rep.CacheBytesMax = max(rep.CacheBytesMax, s.Messages.Bytes+s.Chunks.Bytes+s.Conversations.Bytes)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rep.HeapInuseMax = max(rep.HeapInuseMax, ms.HeapInuse)
}

// rss reads a memory figure (VmRSS, VmHWM) of this process from
// /proc/self/status in bytes; 0 where there is none.
func rss(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			f := strings.Fields(line[len(field)+1:])
			if len(f) >= 1 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
