package load

import (
	"bufio"
	"encoding/json"
	"fmt"
	"time"
)

// MooncakeOptions configures Mooncake.
type MooncakeOptions struct {
	// TimeScale multiplies arrival offsets (0.1 replays 10× faster).
	// 0 means 1.
	TimeScale float64
	// RateScale multiplies the arrival rate: offsets are divided by it
	// (2 replays twice as fast). 0 means 1. Combines with TimeScale.
	RateScale float64
	// Limit keeps only the first Limit requests (after StartAt); 0 keeps all.
	Limit int
	// MaxTokensCap caps each request's max_tokens (the trace's
	// output_length); 0 means no cap.
	MaxTokensCap int
	// StartAt skips the requests that arrive before this trace time; the
	// first kept request's offset is measured from StartAt.
	StartAt time.Duration
	// Materialize fills Request.Messages with the synthesized prompt text
	// up front. By default Messages is nil and the text is synthesized when
	// the request is sent (Request.Chat), since the whole trace is about
	// 580 MB of text.
	Materialize bool
}

// mooncakeLine is one line of conversation_trace.jsonl.
type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// Mooncake reads the Mooncake FAST'25 conversation trace (JSON lines with
// timestamp in ms, input_length, output_length and hash_ids of 512-token
// prefix-chained blocks) at path and returns its replay: one request per
// line, a single user message whose content is the synthetic texts of its
// hash IDs (MooncakeBlockText) concatenated and cut to input_length tokens
// (4 bytes per token), max_tokens = output_length (at least 1), Blocks =
// hash_ids and no sessions. An empty path, or one naming no file, gives a
// *TraceError saying where to download the trace.
func Mooncake(path string, opt MooncakeOptions) (*Workload, error) {
	f, err := openTrace(TraceMooncake, path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	scale := 1.0
	if opt.TimeScale > 0 {
		scale *= opt.TimeScale
	}
	if opt.RateScale > 0 {
		scale /= opt.RateScale
	}
	w := &Workload{Name: "mooncake"}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, lineNo, err)
		}
		ts := time.Duration(l.Timestamp * float64(time.Millisecond))
		if ts < opt.StartAt {
			continue
		}
		if l.InputLength <= 0 || len(l.HashIDs) == 0 {
			return nil, fmt.Errorf("%s:%d: empty prompt", path, lineNo)
		}
		out := max(l.OutputLength, 1)
		if opt.MaxTokensCap > 0 {
			out = min(out, opt.MaxTokensCap)
		}
		r := Request{
			At:           time.Duration(float64(ts-opt.StartAt) * scale),
			MaxTokens:    out,
			PromptTokens: l.InputLength,
			Blocks:       l.HashIDs,
			DependsOn:    -1,
		}
		if opt.Materialize {
			r.Messages = r.Chat()
		}
		w.Requests = append(w.Requests, r)
		if opt.Limit > 0 && len(w.Requests) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sortByArrival(w.Requests)
	return w, nil
}
