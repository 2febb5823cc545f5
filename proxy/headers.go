package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

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
// Connection), and appends the client address to X-Forwarded-For.
// Authorization passes through untouched.
func copyRequestHeaders(ctx *fasthttp.RequestCtx, up *fasthttp.Request) {
	ctx.Request.Header.CopyTo(&up.Header)
	for _, v := range ctx.Request.Header.PeekAll("Connection") {
		connectionTokens(v, func(name []byte) { up.Header.DelBytes(name) })
	}
	for _, h := range hopHeaders {
		up.Header.Del(h)
	}
	up.Header.ResetConnectionClose()
	ip := ctx.RemoteIP().String()
	if prior := ctx.Request.Header.Peek("X-Forwarded-For"); len(prior) > 0 {
		up.Header.Set("X-Forwarded-For", string(prior)+", "+ip)
	} else {
		up.Header.Set("X-Forwarded-For", ip)
	}
}

// copyResponseHeaders copies a replica's response headers to the client
// response without the hop-by-hop ones and without framing headers, which
// the server sets for the body it writes.
func copyResponseHeaders(resp *fasthttp.Response, out *fasthttp.ResponseHeader) {
	var named [][]byte
	for _, v := range resp.Header.PeekAll("Connection") {
		connectionTokens(v, func(name []byte) { named = append(named, name) })
	}
	out.SetStatusCode(resp.StatusCode())
	for k, v := range resp.Header.All() {
		if isHop(k) || bytes.EqualFold(k, []byte("Content-Length")) {
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

func isHop(k []byte) bool {
	for _, h := range hopHeaders {
		if bytes.EqualFold(k, []byte(h)) {
			return true
		}
	}
	return false
}
