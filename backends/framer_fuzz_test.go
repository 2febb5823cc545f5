package backends

import (
	"bufio"
	"bytes"
	"testing"

	"github.com/valyala/fasthttp"
)

// framerRun is what the framer made of an answer fed to it in pieces of
// step bytes.
type framerRun struct {
	state int
	bad   int // the refused byte's index in the answer, or -1
	stray bool
	end   int // the index just past the byte that ended the answer, or -1
}

func runFramer(raw []byte, step int, head, checks bool) framerRun {
	var f framer
	f.checkHeads = checks
	f.start(head)
	r := framerRun{bad: -1, end: -1}
	for off := 0; off < len(raw); off += step {
		part := raw[off:min(off+step, len(raw))]
		if f.feed(part) {
			r.stray = true
		}
		if len(f.hdr) > maxHead {
			panic("head line kept past maxHead")
		}
		if f.state == frRefused && r.bad < 0 {
			r.bad = off + f.bad
		}
		if f.state == frIdle && r.end < 0 && step == 1 {
			r.end = off + 1
		}
	}
	r.state = f.state
	return r
}

// FuzzFramerHeads: a replica's answer, split at random. Whatever the
// bytes, the framer never panics, keeps no more than maxHead of a head
// line, and splitting the same bytes differently gives the same end
// state, refusal and stray bytes. Against fasthttp's own reading of the
// answer (the reader the framer follows): where fasthttp reads an answer
// whole, the framer, fed exactly those bytes, has not ended it early, and
// ends it there unless it gave up following it or refused its head; a
// head the framer lets through is one fasthttp reads, or one fasthttp
// fails on, never a 101.
func FuzzFramerHeads(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\ncontent-length :  3 \r\n\r\nabc",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX: y\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\nok",
		"\r\n\r\nHTTP/1.1  204 No Content\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"HTTP/2.0 101 X\r\n\r\n",
		"HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
	} {
		f.Add([]byte(s+"HTTP/1.1 200 OK\r\n"), uint8(3), false)
		f.Add([]byte(s), uint8(0), true)
	}
	f.Fuzz(func(t *testing.T, raw []byte, step uint8, head bool) {
		for _, checks := range []bool{false, true} {
			whole := runFramer(raw, len(raw)+1, head, checks)
			split := runFramer(raw, int(step)+1, head, checks)
			bytewise := runFramer(raw, 1, head, checks)
			if split.state != whole.state || split.bad != whole.bad || split.stray != whole.stray ||
				bytewise.state != whole.state || bytewise.bad != whole.bad || bytewise.stray != whole.stray {
				t.Fatalf("checks %v: whole %+v, split every %d %+v, byte by byte %+v", checks, whole, step+1, split, bytewise)
			}
			if !checks {
				continue
			}
			var resp fasthttp.Response
			resp.SkipBody = head
			src := &countingReader{r: bytes.NewReader(raw)}
			br := bufio.NewReaderSize(src, 4096)
			if err := resp.Read(br); err != nil {
				continue // fasthttp closes the connection
			}
			read := src.n - br.Buffered()
			if resp.StatusCode() == fasthttp.StatusSwitchingProtocols && bytewise.bad < 0 {
				t.Fatalf("a 101 fasthttp reads got past the head checks: %q", raw[:read])
			}
			in := runFramer(raw[:read], 1, head, checks)
			switch {
			case in.bad >= 0 || in.state == frUnknown:
			case in.end >= 0 && in.end < read:
				t.Fatalf("the framer ended the answer at %d, fasthttp read %d bytes: %q", in.end, read, raw[:read])
			case in.state != frIdle:
				t.Fatalf("fasthttp read the answer whole in %d bytes, the framer is in state %d: %q", read, in.state, raw[:read])
			}
		}
	})
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r *bytes.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// BenchmarkFramerAnswer follows a small chat answer, head and body in one
// read, as every proxied answer is followed.
func BenchmarkFramerAnswer(b *testing.B) {
	answer := []byte("HTTP/1.1 200 OK\r\ndate: Mon, 07 Dec 2026 14:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 2\r\n" +
		"content-type: application/json\r\n\r\n{}")
	var f framer
	f.checkHeads = true
	b.ReportAllocs()
	b.SetBytes(int64(len(answer)))
	for b.Loop() {
		f.start(false)
		if f.feed(answer) || f.state != frIdle {
			b.Fatal("answer not followed")
		}
	}
}
