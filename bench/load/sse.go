package load

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"time"

	"github.com/valyala/fastjson"
)

var parserPool fastjson.ParserPool

// stream accumulates what a response tells about one request.
type stream struct {
	t0          time.Time
	ttft        time.Duration // 0 until the first content
	end         time.Duration // when [DONE] (or the final JSON body) arrived
	events      int           // content events
	done        bool          // [DONE] seen
	errEvent    bool          // an error object arrived
	usage       bool
	cached      bool
	promptTok   int
	complTok    int
	cachedTok   int
	parseErrors int
}

// onJSON handles one JSON payload: a streamed chunk, or a whole
// non-streamed response.
func (s *stream) onJSON(p *fastjson.Parser, data []byte, now time.Time) {
	v, err := p.ParseBytes(data)
	if err != nil {
		s.parseErrors++
		return
	}
	if e := v.Get("error"); e != nil && e.Type() != fastjson.TypeNull {
		s.errEvent = true
		return
	}
	if ch := v.Get("choices", "0"); ch != nil {
		content := len(ch.GetStringBytes("delta", "content")) > 0 ||
			len(ch.GetStringBytes("delta", "reasoning_content")) > 0 ||
			len(ch.GetStringBytes("message", "content")) > 0 ||
			len(ch.GetStringBytes("text")) > 0
		if content {
			if s.events == 0 {
				s.ttft = now.Sub(s.t0)
			}
			s.events++
		}
	}
	if u := v.Get("usage"); u != nil && u.Type() == fastjson.TypeObject {
		s.usage = true
		s.promptTok = u.GetInt("prompt_tokens")
		s.complTok = u.GetInt("completion_tokens")
		if c := u.Get("prompt_tokens_details", "cached_tokens"); c != nil && c.Type() == fastjson.TypeNumber {
			s.cached = true
			s.cachedTok = c.GetInt()
		}
	}
}

// errTooLong reports an SSE line longer than maxLine.
var errTooLong = errors.New("sse line too long")

const maxLine = 16 << 20

// readSSE reads a server-sent event stream from body until EOF, [DONE]
// followed by EOF, an error event, or a read error, which it returns (nil
// at a clean EOF).
func (s *stream) readSSE(body io.Reader) error {
	br := bufio.NewReaderSize(body, 8<<10)
	p := parserPool.Get()
	defer parserPool.Put(p)
	var data, long []byte
	hasData := false
	dispatch := func() {
		if !hasData {
			return
		}
		now := time.Now()
		d := bytes.TrimSpace(data)
		switch {
		case bytes.Equal(d, []byte("[DONE]")):
			s.done = true
			s.end = now.Sub(s.t0)
		case len(d) > 0:
			s.onJSON(p, d, now)
		}
		data, hasData = data[:0], false
	}
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			long = append(long[:0], line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
				if len(long) > maxLine {
					return errTooLong
				}
			}
			line = long
		}
		if len(line) > 0 {
			line = bytes.TrimRight(line, "\r\n")
			switch {
			case len(line) == 0:
				dispatch()
			case line[0] == ':':
			case bytes.HasPrefix(line, []byte("data:")):
				v := line[5:]
				if len(v) > 0 && v[0] == ' ' {
					v = v[1:]
				}
				if hasData {
					data = append(data, '\n')
				}
				data = append(data, v...)
				hasData = true
			}
			if s.errEvent {
				return nil
			}
		}
		if err != nil {
			dispatch() // be lenient about a last event without its blank line
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}
