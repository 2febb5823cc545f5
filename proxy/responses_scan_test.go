package proxy

import (
	"strings"
	"testing"
)

// scanAll feeds stream to a fresh scanner in pieces cut at cuts (offsets in
// increasing order) and returns the scanner.
func scanAll(stream string, cuts ...int) *responseIDScanner {
	s := &responseIDScanner{}
	prev := 0
	for _, c := range append(cuts, len(stream)) {
		// Each piece in its own buffer, overwritten once fed, as the
		// relay's copy buffer is.
		piece := []byte(stream[prev:c])
		more := s.feed(piece)
		for i := range piece {
			piece[i] = 'X'
		}
		prev = c
		if !more {
			break
		}
	}
	return s
}

const createdEvent = "event: response.created\n" +
	`data: {"response":{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]},"sequence_number":0,"type":"response.created"}` + "\n\n"

func TestResponseIDScanner(t *testing.T) {
	longInstr := strings.Repeat("i", 100<<10)
	cases := []struct {
		name, stream, want string
	}{
		{"vLLM's framing", createdEvent + "event: response.completed\ndata: {\"response\":{\"id\":\"resp_abc\"}}\n\n", "resp_abc"},
		{"CRLF line ends", strings.ReplaceAll(createdEvent, "\n", "\r\n"), "resp_abc"},
		{"no event names", `data: {"type":"response.created","response":{"id":"resp_d"}}` + "\n\n", "resp_d"},
		{"no space after colons", "event:response.created\ndata:{\"response\":{\"id\":\"resp_e\"}}\n\n", "resp_e"},
		{"comments and other fields", ": keep-alive\nid: 7\nretry: 100\nevent: response.created\ndata: {\"response\":{\"id\":\"resp_f\"}}\n\n", "resp_f"},
		{"data over several lines", "event: response.created\ndata: {\"response\":\ndata: {\"id\":\"resp_g\"}}\n\n", "resp_g"},
		{"an error event first", "event: error\ndata: {\"response\":{\"id\":\"not_this\"}}\n\nevent: response.created\ndata: {\"response\":{\"id\":\"resp_h\"}}\n\n", "resp_h"},
		{"nested ids only", "event: response.output_item.added\ndata: {\"item\":{\"id\":\"msg_1\"}}\n\nevent: response.in_progress\ndata: {\"response\":{\"id\":\"resp_i\"}}\n\n", "resp_i"},
		{"large event, id first", "event: response.created\ndata: {\"response\":{\"id\":\"resp_j\",\"instructions\":\"" + longInstr + "\"}}\n\n", "resp_j"},
		{"id past the bound", "event: response.created\ndata: {\"response\":{\"instructions\":\"" + longInstr + "\",\"id\":\"resp_k\"}}\n\n", ""},
		{"event not ended", "event: response.created\ndata: {\"response\":{\"id\":\"resp_l\"}}\n", ""},
		{"id too long", "data: {\"response\":{\"id\":\"" + strings.Repeat("x", 300) + "\"}}\n\n", ""},
		{"not an event stream", `{"id":"resp_m","object":"response"}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if s := scanAll(c.stream); s.found != c.want {
				t.Fatalf("whole: found %q, want %q", s.found, c.want)
			}
			// Cut anywhere (every offset for short streams), and byte by byte.
			step := 1
			if len(c.stream) > 2000 {
				step = 997
			}
			for at := 0; at <= len(c.stream); at += step {
				if s := scanAll(c.stream, at); s.found != c.want {
					t.Fatalf("cut at %d: found %q, want %q", at, s.found, c.want)
				}
			}
			if len(c.stream) < 2000 {
				cuts := make([]int, len(c.stream))
				for i := range cuts {
					cuts[i] = i
				}
				if s := scanAll(c.stream, cuts...); s.found != c.want {
					t.Fatalf("byte by byte: found %q, want %q", s.found, c.want)
				}
			}
		})
	}
}

func TestResponseIDScannerIsBounded(t *testing.T) {
	// A huge first event, fed in small pieces, neither found nor held whole.
	huge := "event: response.created\ndata: {\"response\":{\"x\":\"" + strings.Repeat("y", 4<<20) + "\",\"id\":\"r\"}}\n\n"
	var cuts []int
	for at := 1000; at < len(huge); at += 1000 {
		cuts = append(cuts, at)
	}
	s := scanAll(huge, cuts...)
	if s.found != "" {
		t.Errorf("found %q past the bound", s.found)
	}
	if limit := maxIDLine + maxIDEvent; s.maxBytes > limit {
		t.Errorf("held %d bytes, bound %d", s.maxBytes, limit)
	}
	// A stream without a response event is given up after maxIDEvents.
	var b strings.Builder
	for i := 0; i < maxIDEvents; i++ {
		b.WriteString("event: response.output_text.delta\ndata: {\"delta\":\"x\"}\n\n")
	}
	s = &responseIDScanner{}
	if s.feed([]byte(b.String())) {
		t.Errorf("still scanning after %d events without an id", maxIDEvents)
	}
	// Found: the scan stops and lets go of its buffers.
	s = &responseIDScanner{}
	if s.feed([]byte(createdEvent)) || s.found != "resp_abc" || s.line != nil || s.data != nil {
		t.Errorf("after the id: found %q, line %d data %d bytes held", s.found, cap(s.line), cap(s.data))
	}
}

func TestResponseIDOfPath(t *testing.T) {
	for path, want := range map[string]string{
		"/v1/responses/resp_1":             "resp_1",
		"/v1/responses/resp_1/cancel":      "resp_1",
		"/v1/responses/resp_1/input_items": "resp_1",
		"/v1/responses":                    "",
		"/v1/responses/":                   "",
		"/v1/responsesX/resp_1":            "",
		"/v1/chat/completions":             "",
	} {
		if got := responseIDOfPath(path); got != want {
			t.Errorf("responseIDOfPath(%q) = %q, want %q", path, got, want)
		}
	}
}

// FuzzResponseIDScan: any stream, cut anywhere, finds what the whole stream
// finds, holding no more than the bound.
func FuzzResponseIDScan(f *testing.F) {
	f.Add([]byte(createdEvent), uint16(10), uint16(40))
	f.Add([]byte(strings.ReplaceAll(createdEvent, "\n", "\r\n")), uint16(1), uint16(2))
	f.Add([]byte("data: {\"response\":{\"id\":\"a\"}}\n\n"), uint16(0), uint16(5))
	f.Add([]byte("event: error\n\ndata:\ndata: x\n\n:c\n\n"), uint16(3), uint16(9))
	f.Fuzz(func(t *testing.T, stream []byte, a, b uint16) {
		whole := scanAll(string(stream))
		x, y := min(int(a), len(stream)), min(int(b), len(stream))
		if x > y {
			x, y = y, x
		}
		cut := scanAll(string(stream), x, y)
		if cut.found != whole.found {
			t.Fatalf("cut at %d, %d: found %q; whole: %q", x, y, cut.found, whole.found)
		}
		if limit := maxIDLine + maxIDEvent; cut.maxBytes > limit || whole.maxBytes > limit {
			t.Fatalf("held %d/%d bytes, bound %d", cut.maxBytes, whole.maxBytes, limit)
		}
	})
}
