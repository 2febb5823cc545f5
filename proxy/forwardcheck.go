package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
)

// allowedMethods are the methods kvroute forwards, as its Allow header
// lists them: those an OpenAI-compatible server can answer. Any other
// method (CONNECT, TRACE, WebDAV's, made-up ones) gets 405 without
// reaching a replica: a replica has nothing to serve for it, and CONNECT
// and TRACE would make kvroute a tunnel or a mirror of its own headers.
const allowedMethods = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"

// forwardedMethods are allowedMethods, one string each.
var forwardedMethods = [...]string{fasthttp.MethodGet, fasthttp.MethodHead, fasthttp.MethodPost, fasthttp.MethodPut,
	fasthttp.MethodDelete, fasthttp.MethodPatch, fasthttp.MethodOptions}

// forwardedMethod returns the one of forwardedMethods that m is,
// case-sensitive as methods are, and whether there is one.
func forwardedMethod(m []byte) (string, bool) {
	for _, k := range forwardedMethods {
		if string(m) == k {
			return k, true
		}
	}
	return "", false
}

// methodAllowed reports whether m is one of allowedMethods.
func methodAllowed(m []byte) bool {
	_, ok := forwardedMethod(m)
	return ok
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

// errBadResponseHead is the read error of a replica connection whose
// response head kvroute does not accept (see backends.ErrBadResponseHead).
var errBadResponseHead = backends.ErrBadResponseHead

// deadlineSlack is the fraction of a wait by which a deadline may pass
// early: the one of the read deadlines on replica connections.
const deadlineSlack = backends.DeadlineSlack
