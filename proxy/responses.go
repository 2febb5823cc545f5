package proxy

import (
	"bytes"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
)

// The Responses API is stateful on the engine: a replica keeps the
// responses it produced in its own memory. kvroute records which replica
// produced each response id, from the answer to POST /v1/responses (the
// JSON body's top-level "id", or in a stream the response.id of its first
// response.* event, response.created), and sends what refers to that id to
// the same replica: a POST /v1/responses with previous_response_id, and any
// request on /v1/responses/{id} (GET, DELETE, POST .../cancel,
// GET .../input_items). Such a request is not retried on another replica,
// which would not have the response. An id kvroute does not know, or whose
// replica is out of service or gone, is routed as any other request; the
// replica that gets it answers as an engine does for an id it lacks (404).

const (
	pathResponses       = "/v1/responses"
	pathResponsesPrefix = pathResponses + "/"
)

// responseIDOfPath returns the {id} of /v1/responses/{id} and of its
// sub-paths (/v1/responses/{id}/cancel), or "" for any other path.
func responseIDOfPath(path string) string {
	if len(path) <= len(pathResponsesPrefix) || path[:len(pathResponsesPrefix)] != pathResponsesPrefix {
		return ""
	}
	id := path[len(pathResponsesPrefix):]
	if i := strings.IndexByte(id, '/'); i >= 0 {
		id = id[:i]
	}
	return id
}

// noteResponse updates the router's table from an answer read whole: the
// id a POST /v1/responses created, an id /v1/responses/{id} answered for
// (learned or refreshed), or one it deleted. Only 2xx answers count.
func (p *Proxy) noteResponse(ctx *fasthttp.RequestCtx, rep *backends.Replica, status int, body []byte) {
	if status < 200 || status > 299 {
		return
	}
	path := ctx.Path()
	if len(path) < len(pathResponses) || string(path[:len(pathResponses)]) != pathResponses {
		return // the common case, decided without a copy
	}
	table := p.router.Responses()
	if table == nil {
		return
	}
	if len(path) == len(pathResponses) {
		if ctx.IsPost() {
			if id, ok := oai.LookupString(body, "id"); ok {
				table.Record(id, rep)
			}
		}
		return
	}
	id := responseIDOfPath(string(path))
	switch {
	case id == "":
	case ctx.IsDelete() && bytes.Equal(path[len(pathResponsesPrefix):], []byte(id)):
		table.Remove(id)
	default:
		table.Record(id, rep)
	}
}

// responseScanner returns what watches a relayed stream for the id of the
// response it creates: for the 2xx event stream of a POST /v1/responses
// (its headers already copied to ctx); nil for every other stream.
func (p *Proxy) responseScanner(ctx *fasthttp.RequestCtx, rep *backends.Replica, status int) *responseIDScanner {
	if status < 200 || status > 299 || !ctx.IsPost() || string(ctx.Path()) != pathResponses ||
		!isEventStream(ctx.Response.Header.ContentType()) {
		return nil
	}
	table := p.router.Responses()
	if table == nil {
		return nil
	}
	return &responseIDScanner{table: table, rep: rep}
}

// Bounds of the stream scan for a response id.
const (
	// maxIDEvent bounds the data kept of one event: the response object of
	// response.created holds the request's instructions and tools, but its
	// id comes first, and LookupString finds it in a prefix.
	maxIDEvent = 64 << 10
	// maxIDLine bounds a line carried over from one read to the next: an
	// event's data field with its "data: " prefix.
	maxIDLine = maxIDEvent + len("data: ")
	// maxIDEvents is the number of events looked at: the id is in the
	// first (response.created); a stream without it is not scanned on.
	maxIDEvents = 8
)

// responseIDScanner reads a Responses-API event stream as it passes, in
// pieces split anywhere, and records the response id of its first
// response.* event (response.created, response.in_progress, ... all carry
// the response object) for rep. It keeps at most maxIDLine bytes of a line
// cut by a read and maxIDEvent bytes of an event's data, and stops after
// the id or after maxIDEvents events. Lines end with "\n" or "\r\n".
type responseIDScanner struct {
	table *router.Responses // nil: only found is set (tests)
	rep   *backends.Replica

	line     []byte // the current line's bytes so far, when a read ended inside it
	data     []byte // the current event's data lines, joined by '\n'
	hasData  bool   // a data field was seen in the current event
	other    bool   // the current event is named, and not response.*
	events   int
	done     bool
	found    string // the id recorded
	maxBytes int    // the most bytes held at once, for tests
}

// feed reads the next piece of the stream and reports whether the scanner
// wants more.
func (s *responseIDScanner) feed(b []byte) bool {
	for len(b) > 0 && !s.done {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			s.line = appendBounded(s.line, b, maxIDLine)
			break
		}
		if len(s.line) == 0 {
			s.onLine(b[:i])
		} else {
			s.line = appendBounded(s.line, b[:i], maxIDLine)
			s.onLine(s.line)
			s.line = s.line[:0]
		}
		b = b[i+1:]
	}
	if n := cap(s.line) + cap(s.data); n > s.maxBytes {
		s.maxBytes = n
	}
	if s.done {
		s.line, s.data = nil, nil
	}
	return !s.done
}

// appendBounded appends to dst as much of b as keeps it within limit
// bytes; its capacity never grows past limit either.
func appendBounded(dst, b []byte, limit int) []byte {
	if room := limit - len(dst); len(b) > room {
		b = b[:max(room, 0)]
	}
	if n := len(dst) + len(b); n > cap(dst) {
		grown := make([]byte, len(dst), min(max(2*cap(dst), n, 512), limit))
		copy(grown, dst)
		dst = grown
	}
	return append(dst, b...)
}

// onLine handles one line of the stream, without its end.
func (s *responseIDScanner) onLine(l []byte) {
	if n := len(l); n > 0 && l[n-1] == '\r' {
		l = l[:n-1]
	}
	if len(l) == 0 {
		s.dispatch()
		return
	}
	if l[0] == ':' {
		return // a comment
	}
	field, value := l, []byte(nil)
	if c := bytes.IndexByte(l, ':'); c >= 0 {
		field, value = l[:c], l[c+1:]
		if len(value) > 0 && value[0] == ' ' {
			value = value[1:]
		}
	}
	switch string(field) {
	case "event":
		s.other = !bytes.HasPrefix(value, []byte("response."))
	case "data":
		if s.other {
			return
		}
		if s.hasData {
			s.data = appendBounded(s.data, []byte{'\n'}, maxIDEvent)
		}
		s.hasData = true
		s.data = appendBounded(s.data, value, maxIDEvent)
	}
}

// dispatch ends the current event.
func (s *responseIDScanner) dispatch() {
	if !s.hasData && !s.other {
		return // blank lines between events, or an event of other fields
	}
	if s.hasData && !s.other {
		if id, ok := oai.LookupString(s.data, "response", "id"); ok && id != "" && len(id) <= router.MaxResponseIDBytes {
			s.found, s.done = id, true
			s.table.Record(id, s.rep)
		}
	}
	s.data, s.hasData, s.other = s.data[:0], false, false
	if s.events++; s.events >= maxIDEvents {
		s.done = true
	}
}
