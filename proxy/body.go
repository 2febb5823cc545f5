package proxy

import (
	"errors"
	"io"
	"math/bits"
	"net"
	"sync"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/oai"
)

// Request bodies are read as they arrive, never into a buffer sized from
// the Content-Length a client declares: fasthttp streams them
// (Server.StreamRequestBody) and readBody copies them into a pooled buffer
// that doubles as bytes come in. What a connection holds for its body is
// bounded three ways:
//
//   - before the handler runs, fasthttp reads at most the first 8 KiB of a
//     body (or less, when the body is shorter) into a buffer of that size;
//   - a body is at most limits.max_body_bytes (413 past it), so its buffer
//     is at most that rounded up to a power of two, at least 4 KiB; an
//     HTTP/1.1 connection reads one request at a time, so this is also the
//     connection's bound;
//   - all the bodies being read or held at once, across connections, take
//     at most limits.max_body_buffer_bytes of buffer capacity (growing a
//     buffer holds the old and the new one until the copy is done). A body
//     whose next buffer would pass that bound is not read further: its
//     request gets 503 body_budget_exhausted with Retry-After, at once
//     rather than after a wait (waiting would hold the connection and what
//     it has sent), and its connection is closed.
//
// A buffer goes back to its pool, and its bytes to the global budget, when
// Handle returns, on every path: the parsed request aliases it, and every
// attempt's upstream write (rep.Client().Do in forward) is done by then. A
// response relayed after Handle returns reads nothing of the request body.

const (
	// minBodyShift is log2 of the smallest body buffer, 4 KiB.
	minBodyShift = 12
	// prefetchBytes is the most of a body fasthttp reads before the
	// handler runs (readBodyWithStreaming): bytes that have arrived.
	prefetchBytes = 8 << 10
)

// bodyBuf is a pooled request-body buffer. Its capacity is always a size
// class, 4 KiB << its class.
type bodyBuf struct {
	b     []byte
	class int
}

// bodyPools holds free buffers by size class: 4 KiB << i for pool i.
var bodyPools [48]sync.Pool

// bodyClass is the smallest size class holding n bytes.
func bodyClass(n int) int {
	if n <= 1<<minBodyShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minBodyShift
}

// takeBodyBuf returns an empty buffer of the given class with its capacity
// counted in p.bodies, or nil when that would pass budget bytes.
func (p *Proxy) takeBodyBuf(class int, budget int64) *bodyBuf {
	if class >= len(bodyPools) {
		return nil
	}
	size := int64(1) << (minBodyShift + class)
	if p.bodies.Add(size) > budget {
		p.bodies.Add(-size)
		return nil
	}
	bb, _ := bodyPools[class].Get().(*bodyBuf)
	if bb == nil {
		bb = &bodyBuf{b: make([]byte, 0, size), class: class}
	}
	return bb
}

// giveBodyBuf returns bb to its pool and its capacity to the budget.
func (p *Proxy) giveBodyBuf(bb *bodyBuf) {
	p.bodies.Add(-int64(cap(bb.b)))
	bb.b = bb.b[:0]
	bodyPools[bb.class].Put(bb)
}

// BodyBufferBytes is the buffer capacity held by request bodies being read
// or waiting to be forwarded, the figure limits.max_body_buffer_bytes bounds.
func (p *Proxy) BodyBufferBytes() int64 { return p.bodies.Load() }

// readBody reads the request body of ctx, up to opts.MaxBodyBytes, and
// makes it ctx.Request's body (ctx.Request.Body() returns it, with no
// stream left). The buffer it returns, nil for an empty body, must be
// handed to releaseBody once the request is done with it. On an error the
// body is left unread and the connection must be closed.
func (p *Proxy) readBody(ctx *fasthttp.RequestCtx, opts *Options) (*bodyBuf, *oai.Error) {
	limit := opts.MaxBodyBytes
	declared := ctx.Request.Header.ContentLength() // -1: chunked
	if declared > limit {
		// headerReceived has these answered before any byte is read, as
		// expectBody does, except for HTTP/1.0.
		return nil, bodyTooLarge(limit)
	}
	stream := ctx.RequestBodyStream()
	if stream == nil {
		// No body at all, or a request not read by Server (already whole).
		if len(ctx.Request.Body()) > limit {
			return nil, bodyTooLarge(limit)
		}
		return nil, nil
	}
	if declared == 0 {
		ctx.Request.SetBodyRaw(nil) // leaves no stream for Body to read
		return nil, nil
	}
	want := declared
	if want < 0 {
		// A chunked body: up to the limit; a byte more shows it is over.
		want = limit
	}
	budget := int64(opts.MaxBodyBufferBytes)
	bb := p.takeBodyBuf(bodyClass(min(want, prefetchBytes)), budget)
	if bb == nil {
		return nil, bodyBudgetExhausted()
	}
	bb, e := p.fillBody(stream, bb, want, declared, limit, budget)
	if e != nil {
		p.giveBodyBuf(bb)
		return nil, e
	}
	ctx.Request.SetBodyRaw(bb.b)
	return bb, nil
}

// fillBody reads stream into bb, growing it within budget up to want
// bytes, to the stream's end: a body over limit, or one that ends short of
// declared (-1: chunked), is an error. It returns the buffer that holds
// the body; on an error, the buffer then held, for the caller to give
// back, and the error: readBody's every failure gives it back in one place.
func (p *Proxy) fillBody(stream io.Reader, bb *bodyBuf, want, declared, limit int, budget int64) (*bodyBuf, *oai.Error) {
	for {
		if len(bb.b) == cap(bb.b) {
			if len(bb.b) >= want {
				// Full at the length expected: the body must end here.
				var probe [1]byte
				n, err := stream.Read(probe[:])
				if n > 0 {
					return bb, bodyTooLarge(limit)
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					return bb, bodyReadError(err)
				}
				continue
			}
			nb := p.takeBodyBuf(bodyClass(min(2*cap(bb.b), want)), budget)
			if nb == nil {
				return bb, bodyBudgetExhausted()
			}
			nb.b = append(nb.b, bb.b...)
			p.giveBodyBuf(bb)
			bb = nb
		}
		b := bb.b
		n, err := stream.Read(b[len(b):cap(b)])
		bb.b = b[:len(b)+n]
		if len(bb.b) > limit {
			return bb, bodyTooLarge(limit)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return bb, bodyReadError(err)
		}
	}
	if len(bb.b) < declared {
		// The stream ends a body of known length at the connection's end
		// without an error: the client left before sending all of it.
		return bb, bodyReadError(io.ErrUnexpectedEOF)
	}
	return bb, nil
}

// releaseBody hands back what readBody took, once nothing reads the body
// any more: the buffer goes back to its pool, so ctx.Request no longer
// refers to it.
func (p *Proxy) releaseBody(ctx *fasthttp.RequestCtx, bb *bodyBuf) {
	if bb == nil {
		return
	}
	ctx.Request.SetBodyRaw(nil)
	p.giveBodyBuf(bb)
}

// headerReceived runs once a request's headers are read, before any of its
// body. An HTTP/1.1 request whose Content-Length is over
// limits.max_body_bytes is made to take the Expect: 100-continue path, so
// that expectBody answers 413 at once and the connection is closed, none
// of the body read: fasthttp would otherwise wait for the body's first
// bytes before running the handler.
func (p *Proxy) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if h.ContentLength() > p.live.Load().MaxBodyBytes && h.IsHTTP11() {
		h.Set(fasthttp.HeaderExpect, "100-continue")
	}
	return fasthttp.RequestConfig{}
}

func bodyBudgetExhausted() *oai.Error {
	return oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "body_budget_exhausted",
		"request bodies being read have reached limits.max_body_buffer_bytes; retry later")
}

// bodyReadError classifies an error reading a request body: the client
// took longer than timeouts.client_header (408), closed the connection
// (499, logged and counted only), or sent a malformed chunked body (400).
func bodyReadError(err error) *oai.Error {
	var netErr net.Error
	switch {
	case errors.As(err, &netErr) && netErr.Timeout():
		return oai.NewError(fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "timed out reading the request")
	case isClientGone(err):
		return oai.NewError(statusClientGone, "invalid_request_error", codeClientGone, "the client closed the connection before its request was complete")
	}
	return oai.NewError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_http", "malformed request body")
}
