package backends

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// SetRequestURI points req, about to be sent with [Replica.Client], at the
// replica: its URL's scheme, host and port, then its base path, then
// requestURI, the client's request target ("/v1/chat/completions?x=1"; of
// an absolute-form target only the path and query are kept). The Host
// header becomes the URL's host:port, and a replica that stands for one
// data-parallel rank sets [HeaderDataParallelRank]. Call it before every
// send: fasthttp rewrites a request's URI as it writes it, so a request
// retried on another replica must be pointed again.
func (r *Replica) SetRequestURI(req *fasthttp.Request, requestURI []byte) {
	var buf [256]byte
	b := append(buf[:0], r.target.origin...)
	b = append(b, r.target.path...)
	b = appendOriginForm(b, requestURI)
	req.SetRequestURIBytes(b)
	req.Header.SetHost(r.target.addr)
	r.setRankHeader(req)
}

// appendOriginForm appends the path and query of a request target to dst,
// starting with "/".
func appendOriginForm(dst, target []byte) []byte {
	if len(target) > 0 && target[0] != '/' {
		if i := bytes.Index(target, []byte("://")); i >= 0 {
			// Absolute form: drop scheme and authority.
			target = target[i+3:]
			if j := bytes.IndexAny(target, "/?#"); j >= 0 {
				target = target[j:]
			} else {
				target = nil
			}
		}
	}
	if len(target) == 0 || target[0] != '/' {
		dst = append(dst, '/')
	}
	return append(dst, target...)
}
