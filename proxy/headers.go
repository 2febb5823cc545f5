package proxy

import (
	"bytes"
	"math/rand/v2"

	"github.com/valyala/fasthttp"
)

// headerRequestID carries a request's ID: kept from the client when usable,
// generated otherwise, forwarded to the replica and returned to the client.
const headerRequestID = "X-Request-Id"

// headerBackend names the replica that answered, and headerRoute why it
// was chosen (Options.HideBackendNames, Options.ExposeRouteReason).
const (
	headerBackend = "X-Kvroute-Backend"
	headerRoute   = "X-Kvroute-Route"
)

// maxRequestIDBytes bounds a client's X-Request-Id; a longer one is replaced.
const maxRequestIDBytes = 128

// requestID returns the client's ID v when it is usable (1 to
// maxRequestIDBytes printable ASCII bytes), else a new one.
func requestID(v []byte) string {
	if len(v) == 0 || len(v) > maxRequestIDBytes {
		return newRequestID()
	}
	for _, c := range v {
		if c < 0x20 || c > 0x7e {
			return newRequestID()
		}
	}
	return string(v)
}

// newRequestID returns 16 random hex digits (64 bits: collisions are not a
// concern at any request rate kvroute serves).
func newRequestID() string {
	const hex = "0123456789abcdef"
	var b [16]byte
	v := rand.Uint64()
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = hex[v&0xf]
		v >>= 4
	}
	return string(b[:])
}

// hopHeaders are the hop-by-hop headers of RFC 9110 §7.6.1 (and the
// de-facto Proxy-Connection and Keep-Alive), never forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// connectionTokens calls fn for each header name listed in a Connection
// header value (comma-separated).
func connectionTokens(v []byte, fn func(name []byte)) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			tok, v = v, nil
		}
		tok = bytes.TrimSpace(tok)
		if len(tok) > 0 {
			fn(tok)
		}
	}
}

// copyRequestHeaders copies the client's request headers to the upstream
// request without the hop-by-hop ones (including those named in
// Connection) and without trailers, sets X-Request-Id to id and appends the
// client address to X-Forwarded-For. Authorization passes through
// untouched, and so does Content-Type: a request without one is forwarded
// without one (fasthttp would add application/octet-stream to a body, and
// vLLM reads a missing type as JSON). Host is set with the request URI
// (backends.Replica.SetRequestURI).
func copyRequestHeaders(ctx *fasthttp.RequestCtx, up *fasthttp.Request, id string) {
	ctx.Request.Header.CopyTo(&up.Header)
	up.Header.SetNoDefaultContentType(true)
	dropTrailers(&ctx.Request.Header, &up.Header)
	if hasHop(&up.Header) { // one pass finds none in most requests; each Del is a pass of its own
		for _, v := range ctx.Request.Header.PeekAll("Connection") {
			connectionTokens(v, func(name []byte) { up.Header.DelBytes(name) })
		}
		for _, h := range hopHeaders {
			up.Header.Del(h)
		}
	}
	up.Header.ResetConnectionClose()
	up.Header.Set(headerRequestID, id)
	ip := clientIP(ctx)
	if prior := ctx.Request.Header.Peek("X-Forwarded-For"); len(prior) > 0 {
		up.Header.Set("X-Forwarded-For", string(prior)+", "+ip)
	} else {
		up.Header.Set("X-Forwarded-For", ip)
	}
}

// hasHop reports whether h holds a hop-by-hop field (Connection
// included, which names the others).
func hasHop(h *fasthttp.RequestHeader) bool {
	for k := range h.All() {
		if isHop(k) {
			return true
		}
	}
	return false
}

// copyResponseHeaders copies a replica's response headers to the client
// response without the hop-by-hop ones, without framing headers, which
// the server sets for the body it writes, and without X-Request-Id,
// X-Kvroute-Backend and X-Kvroute-Route, which the proxy sets (a replica
// that is itself a kvroute may not say more than this one).
func copyResponseHeaders(resp *fasthttp.Response, out *fasthttp.ResponseHeader) {
	var named [][]byte
	for _, v := range resp.Header.PeekAll("Connection") {
		connectionTokens(v, func(name []byte) { named = append(named, name) })
	}
	out.SetStatusCode(resp.StatusCode())
	for k, v := range resp.Header.All() {
		if isHop(k) || inList(k, proxySetHeaders) {
			continue
		}
		skip := false
		for _, n := range named {
			if bytes.EqualFold(k, n) {
				skip = true
				break
			}
		}
		if !skip {
			out.AddBytesKV(k, v)
		}
	}
}

// proxySetHeaders are the response fields a replica's answer does not
// pass on: the framing the server sets for the body it writes, and the
// fields the proxy sets itself.
var proxySetHeaders = []string{"Content-Length", headerRequestID, headerBackend, headerRoute}

func isHop(k []byte) bool { return inList(k, hopHeaders) }

// inList reports whether k is one of names, case-insensitively.
func inList(k []byte, names []string) bool {
	for _, n := range names {
		if len(k) == len(n) && bytes.EqualFold(k, []byte(n)) {
			return true
		}
	}
	return false
}
