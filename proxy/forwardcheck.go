package proxy

import (
	"bytes"
	"errors"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
)

// allowedMethods are the methods kvroute forwards, as its Allow header
// lists them: those an OpenAI-compatible server can answer. Any other
// method (CONNECT, TRACE, WebDAV's, made-up ones) gets 405 without
// reaching a replica: a replica has nothing to serve for it, and CONNECT
// and TRACE would make kvroute a tunnel or a mirror of its own headers.
const allowedMethods = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"

// methodAllowed reports whether m, case-sensitive as methods are, is one of
// allowedMethods.
func methodAllowed(m []byte) bool {
	switch string(m) {
	case fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodPost, fasthttp.MethodPut,
		fasthttp.MethodDelete, fasthttp.MethodPatch, fasthttp.MethodOptions:
		return true
	}
	return false
}

// tokenBytes marks the bytes of an RFC 9110 token (tchar).
var tokenBytes = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

// validFieldNames reports whether every field name in raw, a request's
// header block as received, is an RFC 9110 token. fasthttp tolerates a
// name with spaces inside it ("X Bad: 1") and trims spaces before the colon;
// RFC 9112 §5.1 asks a server to reject both. Continuation lines (obs-fold)
// belong to the value above them.
func validFieldNames(raw []byte) bool {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		if len(line) > 0 && line[len(line)-1] == '\r' {
			line = line[:len(line)-1]
		}
		if len(line) == 0 || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return false
		}
		for _, c := range line[:colon] {
			if !tokenBytes[c] {
				return false
			}
		}
	}
	return true
}

// refuseUnforwardable answers, and returns true for, a request kvroute
// does not forward whatever its path: a method outside allowedMethods
// (405 with Allow) or a header field name that is not a token (400). A
// refused CONNECT also closes the connection, so no tunnel bytes the
// client sends after it are read as requests.
func (p *Proxy) refuseUnforwardable(ctx *fasthttp.RequestCtx, o *outcome) bool {
	switch {
	case !methodAllowed(ctx.Method()):
		p.fail(ctx, o, oai.NewError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			"method "+o.method+" is not allowed; allowed: "+allowedMethods))
		ctx.Response.Header.Set(fasthttp.HeaderAllow, allowedMethods)
		if ctx.IsConnect() {
			ctx.SetConnectionClose()
		}
		return true
	case !validFieldNames(ctx.Request.Header.RawHeaders()):
		p.fail(ctx, o, oai.NewError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_header_name",
			"a header field name is not a valid token (RFC 9110 §5.1)"))
		ctx.SetConnectionClose()
		return true
	}
	return false
}

// dropTrailers removes from up, a copy of a client's request headers, the
// fields the client sent in the trailer section of a chunked body, keeping
// any field of the same name from the header section (src, the client's
// headers). fasthttp keeps received trailers apart from headers, but
// deleting the Trailer field, as copyRequestHeaders does with hop-by-hop
// fields, would move them into the header section: this runs first.
// Trailers are not forwarded at all: the body is forwarded with a
// Content-Length, which leaves no place for them, and no engine reads
// them.
func dropTrailers(src *fasthttp.RequestHeader, up *fasthttp.RequestHeader) {
	names := up.PeekTrailerKeys()
	if len(names) == 0 {
		return
	}
	// Deleting a name deletes it from both sections: the header-section
	// values are then added back from src, whose All yields only those.
	// names aliases up's storage, which Del changes: copy them first.
	var buf [8][]byte
	own := buf[:0]
	for _, n := range names {
		own = append(own, append([]byte(nil), n...))
	}
	for _, n := range own {
		up.DelBytes(n)
	}
	up.Del(fasthttp.HeaderTrailer)
	for k, v := range src.All() {
		for _, n := range own {
			if bytes.EqualFold(k, n) {
				up.AddBytesKV(k, v)
				break
			}
		}
	}
}

// refuseInterim settles an attempt whose replica gave an informational
// status (101 Switching Protocols) as its final answer: kvroute relays no
// protocol switch, so the attempt fails with a 502, counted against the
// replica and retried like a 5xx. headGuard refuses such an answer before
// fasthttp returns its connection to the pool; this catches one read on a
// connection without a headGuard, and asks for that connection's close.
func (p *Proxy) refuseInterim(resp *fasthttp.Response, release func(), dec *router.Decision, attempt int, opts *Options) *oai.Error {
	rep := dec.Replica
	status := resp.StatusCode()
	resp.SetConnectionClose()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	release()
	dec.Undo()
	rep.ReportFailure(errors.New("status " + strconv.Itoa(status)))
	if attempt < opts.Retries && !dec.Pinned {
		p.obs.Retry(rep.Name())
	}
	return upstreamError(errBadResponseHead, shownReplica(rep.Name(), opts))
}

// errBadResponseHead is the read error of a replica connection whose
// response head kvroute does not accept (see headGuard).
var errBadResponseHead = errors.New("replica sent a malformed or unsupported response head")

// headGuard wraps a replica connection and checks the head of each
// response as it arrives, failing the read at the first byte it refuses:
//   - a line ending in a bare LF. fasthttp tolerates one but keeps waiting
//     for a CRLF CRLF that never comes, until timeouts.first_byte runs out;
//   - status 101 Switching Protocols: fasthttp hands it over as a final,
//     body-less answer and returns the connection to the pool, which
//     would then carry the replica's upgraded protocol to the next request.
//
// The bytes before the refused one are delivered and the next read fails
// with errBadResponseHead, which fasthttp's header parser passes on
// wrapped (one refused at an answer's very first byte reaches the proxy as
// a connection closed early); fasthttp closes a connection whose read
// failed, and the answer is a 502 either way. Interim answers (1xx other
// than 101) are checked like the head that follows them; bodies, and bytes
// read with no request written, pass through unchecked.
type headGuard struct {
	net.Conn
	written atomic.Bool // a request was written since the last read
	inHead  bool        // reading a response head
	cr      bool        // the last head byte was CR
	line    int         // bytes of the current head line, CR excluded
	lines   int         // complete lines of the current head
	digits  int         // status-code digits read: -1 before the status line's first space, 4 once past the code
	status  int
	err     error // set once the connection is refused: every later read fails
}

func newHeadGuard(c net.Conn) *headGuard { return &headGuard{Conn: c} }

func (g *headGuard) Write(p []byte) (int, error) {
	g.written.Store(true)
	return g.Conn.Write(p)
}

func (g *headGuard) Read(p []byte) (int, error) {
	if g.err != nil {
		return 0, g.err
	}
	if g.written.Load() {
		g.written.Store(false)
		g.startHead()
	}
	n, err := g.Conn.Read(p)
	if g.inHead && n > 0 {
		if k := g.scan(p[:n]); k >= 0 {
			g.err = errBadResponseHead
			if k == 0 {
				return 0, g.err
			}
			return k, nil
		}
	}
	return n, err
}

// switching reports whether the status line read so far is, complete up to
// its code, that of a 101.
func (g *headGuard) switching() bool {
	return g.lines == 0 && g.digits == 3 && g.status == fasthttp.StatusSwitchingProtocols
}

func (g *headGuard) startHead() {
	g.inHead, g.cr = true, false
	g.line, g.lines, g.digits, g.status = 0, 0, -1, 0
}

// scan checks b, the next bytes of a head, and returns the index of the
// first refused byte, or -1.
func (g *headGuard) scan(b []byte) int {
	for i, c := range b {
		switch c {
		case '\n':
			if !g.cr {
				return i
			}
			g.cr = false
			if g.line > 0 {
				g.lines++
				g.line = 0
				continue
			}
			if g.lines == 0 {
				continue // an empty line before the status line
			}
			if g.status >= 100 && g.status < 200 {
				g.startHead() // an interim answer: the real head follows
				continue
			}
			g.inHead = false
			return -1
		case '\r':
			if g.switching() {
				return i
			}
			g.cr = true
		default:
			g.cr = false
			g.line++
			if g.lines > 0 || g.digits > 3 {
				continue
			}
			switch {
			case g.digits < 0:
				if c == ' ' {
					g.digits = 0
				}
			case g.digits == 3:
				if c == ' ' && g.switching() {
					return i
				}
				g.digits = 4 // the status code is over
			case c >= '0' && c <= '9':
				g.status = g.status*10 + int(c-'0')
				g.digits++
			default:
				g.digits = 4 // not a status code: fasthttp will say so
			}
		}
	}
	return -1
}
