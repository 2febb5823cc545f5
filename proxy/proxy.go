// Package proxy is kvroute's OpenAI-compatible HTTP front end: it reads the
// routing fields of each request, asks the router for a replica, forwards the
// original bytes over that replica's pooled connection and relays the answer,
// streaming server-sent events as they arrive.
package proxy

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
)

// Options configures the proxy. Zero values fall back to the defaults named.
type Options struct {
	// MaxBodyBytes is the largest request body accepted; larger gets 413.
	// Default 8 MiB.
	MaxBodyBytes int
	// MaxBodyBufferBytes bounds the buffer capacity held at once by the
	// request bodies being read or forwarded, across all connections;
	// a body that would pass it gets 503 (see body.go). Default 256 MiB.
	MaxBodyBufferBytes int
	// Retries is the number of extra attempts on other replicas, made only
	// before any response byte reached the client. Default 0.
	Retries int
	// ClientReadTimeout bounds reading one request (headers and body) from a
	// client. Default 10s.
	ClientReadTimeout time.Duration
	// IdleTimeout bounds a client's keep-alive idle time: a connection
	// with no next request this long is closed. Default 60s.
	IdleTimeout time.Duration
	// SessionHeader carries a client's session ID. Default X-Session-ID.
	SessionHeader string
	// MaxBufferedResponseBytes is the largest answer of known length read
	// whole from a replica before the client gets it; a larger one is
	// relayed as it arrives, its Content-Length kept. Default 1 MiB.
	MaxBufferedResponseBytes int
	// ClientWriteTimeout is the longest a client may take to accept bytes
	// of its answer: each write to it must complete within it. Default 30s.
	ClientWriteTimeout time.Duration
	// MaxURLBytes bounds the request target; longer gets 414. Default 8192.
	MaxURLBytes int
	// MaxHeaderBytes bounds the request line and headers (the server's read
	// buffer); larger gets 431. Default 32768.
	MaxHeaderBytes int
	// MaxConnections caps concurrent client connections; LimitListener
	// (connlimit.go) enforces it. Default 10000.
	MaxConnections int
	// MaxInflight caps requests being proxied at once; above it, 503 with
	// Retry-After. Default 4096.
	MaxInflight int
	// APIKeys, when not empty, are the bearer tokens clients must present
	// (401 otherwise); the client's Authorization is then not forwarded.
	APIKeys []string
	// HideBackendNames, when true, leaves the X-Kvroute-Backend and
	// X-Kvroute-Route headers off responses and keeps replica names out of
	// error bodies; the access log and metrics still name the replica.
	// Default false: names are shown.
	HideBackendNames bool
	// ExposeRouteReason, when true, sends the decision's reason, with the
	// prompt tokens the replica was believed to hold, in X-Kvroute-Route
	// (unless HideBackendNames). Default false: no answer carries it, a
	// replica's own included, so that no client can learn whether another
	// client's prompt is cached.
	ExposeRouteReason bool
	// Disaggregation is the protocol of a fleet that splits prefill and
	// decode (ProtocolVLLM or ProtocolSGLang, see disagg.go): chat and
	// completions requests then go to a prefill and a decode replica.
	// Default "": every request goes to one replica.
	Disaggregation string
	// LocalPrefill, with ProtocolVLLM, lets a decode replica compute a
	// prompt itself (router.LocalPrefill): one that holds all of it but a
	// few tokens, or one that would be done sooner while the prefill
	// replicas are behind; the request goes to it whole, without a
	// prefill leg. The zero value: never.
	LocalPrefill router.LocalPrefill
	// Flow configures flow control (flow.go); the zero value is off.
	Flow FlowOptions
	// CacheSalt has kvroute set the requests' cache_salt (salt.go); the
	// zero value forwards the caller's.
	CacheSalt SaltOptions
}

func (o *Options) setDefaults() {
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 8 << 20
	}
	if o.MaxBodyBufferBytes <= 0 {
		o.MaxBodyBufferBytes = 256 << 20
	}
	if o.ClientReadTimeout <= 0 {
		o.ClientReadTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 60 * time.Second
	}
	if o.SessionHeader == "" {
		o.SessionHeader = "X-Session-ID"
	}
	if o.MaxBufferedResponseBytes <= 0 {
		o.MaxBufferedResponseBytes = 1 << 20
	}
	if o.ClientWriteTimeout <= 0 {
		o.ClientWriteTimeout = 30 * time.Second
	}
	if o.MaxURLBytes <= 0 {
		o.MaxURLBytes = 8192
	}
	if o.MaxHeaderBytes <= 0 {
		o.MaxHeaderBytes = 32768
	}
	if o.MaxConnections <= 0 {
		o.MaxConnections = 10000
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 4096
	}
}

// Fleet is the part of backends.Fleet the proxy needs.
type Fleet interface {
	Models() []string
}

// Observer receives what the proxy measures; telemetry.Metrics implements it.
type Observer interface {
	// Request records one answer: backend is empty when no replica was
	// reached; ttfb is the time to the answer's first body byte (0 when
	// none was sent) and total the time to its end, both from the
	// request's arrival.
	Request(endpoint, backend string, status int, route string, ttfb, total time.Duration)
	Decision(d time.Duration, matched, keyTokens int)
	Cached(predicted, reported, prompt int, precise bool)
	Retry(backend string)
}

type nopObserver struct{}

func (nopObserver) Request(string, string, int, string, time.Duration, time.Duration) {}
func (nopObserver) Decision(time.Duration, int, int)                                  {}
func (nopObserver) Cached(int, int, int, bool)                                        {}
func (nopObserver) Retry(string)                                                      {}

// Proxy is the fasthttp handler. It is safe for concurrent use.
type Proxy struct {
	router   *router.Router
	fleet    Fleet
	obs      Observer
	log      *zap.Logger
	access   *zap.Logger
	opts     Options                 // as built: sizes the fasthttp server
	live     atomic.Pointer[Options] // current: read once per request, swapped on reload
	inflight atomic.Int64            // requests between Handle and finish
	slowCuts atomic.Int64            // answers cut because their client stopped reading (stream.go)
	streams  streamSet               // stream relays being read, for CutStreams (drain.go)
	conns    atomic.Int64            // client connections open on LimitListener's listeners (connlimit.go)
	bodies   atomic.Int64            // request-body buffer capacity held (body.go)
	pollers  atomic.Pointer[pollers] // while ServeStreams runs (fastrelay.go)
	polled   atomic.Int64            // streams relayed from a taken body (fastrelay.go)
	flow     *flowState              // tenant limits and the queue (flow.go)
}

// New builds a proxy routing through r; obs may be nil.
func New(r *router.Router, fleet Fleet, obs Observer, log *zap.Logger, opts Options) *Proxy {
	opts.setDefaults()
	if obs == nil {
		obs = nopObserver{}
	}
	// An access line names its request, not the line of code that wrote
	// it: without the caller, zap skips a stack walk per request.
	access := log.Named("access").WithOptions(zap.WithCaller(false))
	p := &Proxy{router: r, fleet: fleet, obs: obs, log: log.Named("proxy"), access: access, opts: opts, flow: newFlowState(&opts.Flow)}
	p.live.Store(&opts)
	return p
}

// SetOptions applies new options to requests that start from now on.
// MaxBodyBytes and MaxBodyBufferBytes apply live, both ways: bodies are
// read by the handler (body.go), not by fasthttp beforehand.
func (p *Proxy) SetOptions(o Options) {
	o.setDefaults()
	p.flow.limiter.Set(o.Flow.Limits)
	p.flow.queue.SetLimits(o.Flow.Queue)
	p.live.Store(&o)
	p.wakeFlow()
}

// Server returns a fasthttp server running the proxy with its limits set.
// Serve it on a listener wrapped by LimitListener: that is where
// MaxConnections is enforced, with an answer of the proxy's own. fasthttp's
// cap (Concurrency), whose answer is plain text, is set past it; the margin
// covers connections already closed and counted out (a cut stream's) whose
// fasthttp worker has not returned yet.
func (p *Proxy) Server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                       p.Handle,
		ErrorHandler:                  p.serverError,
		ExpectHandler:                 p.expectBody,
		HeaderReceived:                p.headerReceived, // body.go
		Name:                          "kvroute",
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		MaxRequestBodySize:            p.opts.MaxBodyBytes, // with StreamRequestBody, only caps what is read before the handler
		ReadTimeout:                   p.opts.ClientReadTimeout,
		IdleTimeout:                   p.opts.IdleTimeout,
		WriteTimeout:                  p.opts.ClientWriteTimeout,
		ReadBufferSize:                p.opts.MaxHeaderBytes, // also the cap on the request line and headers
		Concurrency:                   p.opts.MaxConnections + fasthttp.DefaultConcurrency,
		CloseOnShutdown:               true,
		DisablePreParseMultipartForm:  true,
		StreamRequestBody:             true, // bodies are read by readBody (body.go) as they arrive
		DisableHeaderNamesNormalizing: false,
		SecureErrorLogMessage:         true,
		Logger:                        zapPrintf{p.log},
	}
}

type zapPrintf struct{ l *zap.Logger }

func (z zapPrintf) Printf(format string, args ...any) { z.l.Sugar().Debugf(format, args...) }

// serverError answers errors fasthttp meets before the handler runs, and
// logs and counts the answer like any other. A client that closed its
// connection before its request was whole gets 499 in the log and metrics
// (the response written to it goes nowhere).
func (p *Proxy) serverError(ctx *fasthttp.RequestCtx, err error) {
	start := time.Now()
	if ctx.ConnRequestNum() == 0 {
		// The connection's first request began when the connection did.
		start = ctx.ConnTime()
	}
	o := p.newOutcome(ctx, start)
	if len(ctx.Request.Header.RawHeaders()) == 0 {
		// fasthttp failed before the request line and headers were whole:
		// what the header would say (GET /) is its default, not the request.
		o.method, o.path = "", ""
	}
	var e *oai.Error
	var netErr net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = bodyTooLarge(p.live.Load().MaxBodyBytes)
	case errors.As(err, &netErr) && netErr.Timeout():
		e = oai.NewError(fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "timed out reading the request")
	case isSmallBuffer(err):
		e = oai.NewError(fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "headers_too_large", "request line or headers too large")
	case isClientGone(err):
		e = oai.NewError(statusClientGone, "invalid_request_error", codeClientGone, "the client closed the connection before its request was complete")
	default:
		e = oai.NewError(fasthttp.StatusBadRequest, "invalid_request_error", "bad_http", "malformed HTTP request")
	}
	writeError(ctx, e)
	ctx.SetConnectionClose()
	o.status, o.err = e.Status, e.Code
	p.record(o)
}

// statusClientGone is nginx's status for a client that closed its
// connection before it was answered; it is logged and counted, never sent.
const statusClientGone = 499

// codeClientGone is the error code of a request whose client closed its
// connection before it was answered, as the access log records it.
const codeClientGone = "client_gone"

// isClientGone reports whether err means the client closed or reset its
// connection.
func isClientGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, net.ErrClosed)
}

// expectBody answers the Expect: 100-continue of a request before its body
// is sent. One whose Content-Length is over limits.max_body_bytes gets its
// 413 at once, without a 100 Continue, so the client never sends the body;
// fasthttp then writes the response made here and closes the connection
// (TestSelfWrittenAnswersAreAccounted holds it to that).
func (p *Proxy) expectBody(ctx *fasthttp.RequestCtx) int {
	limit := p.live.Load().MaxBodyBytes
	if ctx.Request.Header.ContentLength() <= limit {
		return fasthttp.StatusContinue
	}
	o := p.newOutcome(ctx, time.Now())
	e := bodyTooLarge(limit)
	writeError(ctx, e)
	o.status, o.err = e.Status, e.Code
	p.record(o)
	return e.Status
}

func bodyTooLarge(limit int) *oai.Error {
	return oai.NewError(fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large",
		"request body exceeds limits.max_body_bytes ("+strconv.Itoa(limit)+" bytes)")
}

func isSmallBuffer(err error) bool {
	var sb *fasthttp.ErrSmallBuffer
	return errors.As(err, &sb)
}

func writeError(ctx *fasthttp.RequestCtx, e *oai.Error) {
	ctx.Response.Reset()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	switch e.Status {
	case fasthttp.StatusServiceUnavailable:
		ctx.Response.Header.Set("Retry-After", "1")
	case fasthttp.StatusUnauthorized:
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
	}
	ctx.SetBody(e.Body())
}

// outcome collects what the access log says of one request. Its strings
// are copies: they outlive the request's buffers.
type outcome struct {
	ctx      *fasthttp.RequestCtx
	start    time.Time
	id       string // request ID: the client's X-Request-Id when usable, else generated
	client   string // remote address
	xff      string // the client's X-Forwarded-For, as received
	ua       string
	method   string
	path     string
	model    string
	endpoint string // metrics label: the routed path, "/v1/models" or "other"
	matched  int    // tokens the chosen replica was believed to hold
	best     int    // tokens the best candidate was believed to hold
	exact    int    // the prompt's length in the renderer's tokens (precise mode), 0 when unknown
	replica  string
	prefill  string // the prefill replica of a disaggregated request
	route    string
	status   int
	ttfb     time.Duration // to the first body byte sent; 0 when none was
	bytes    int64         // body bytes sent, self-written bodies included
	tries    int
	err      string
	streamed bool // the body is relayed after the handler returns
	// usageSeen: the prompt's reuse was taken from the prefill side of a
	// disaggregated request (the decode side reports it all cached).
	usageSeen bool
	// reuse is the prompt's reuse split (reuse.go), once the engine's
	// usage gave it (reuseSeen).
	reuse     Reuse
	reuseSeen bool
	// unreserve takes back the dispatcher's reservation of a replica for
	// the request once it holds a replica's in-flight slot (flow.go).
	unreserve func()
	// flowDone releases what flow control holds for the request (its
	// tenant's concurrency slot); run by finish.
	flowDone func()
	// avoid are the saturated replicas flow control keeps the request
	// off while another has room (flow.go).
	avoid []*backends.Replica
}

// maxLogField bounds a client-given string in the access log.
const maxLogField = 512

// logBytes copies at most maxLogField bytes of b for the access log.
func logBytes(b []byte) string {
	if len(b) > maxLogField {
		b = b[:maxLogField]
	}
	return string(b)
}

// logString is logBytes for a string, which may alias a reused buffer.
func logString(s string) string {
	return strings.Clone(logTrunc(s))
}

// logTrunc cuts a string kvroute owns to maxLogField bytes.
func logTrunc(s string) string {
	if len(s) > maxLogField {
		s = s[:maxLogField]
	}
	return s
}

// methodString is logBytes for a method: one of the methods forwarded
// (allowedMethods) is a constant, not a copy.
func methodString(m []byte) string {
	if k, ok := forwardedMethod(m); ok {
		return k
	}
	return logBytes(m)
}

// clientAddr is the client's address for the access log: the one worked
// out when the connection was accepted (countedConn), else made now.
func clientAddr(ctx *fasthttp.RequestCtx) string {
	if c := counted(ctx); c != nil {
		return c.remote
	}
	return ctx.RemoteAddr().String()
}

// clientIP is the client's IP for X-Forwarded-For, as clientAddr.
func clientIP(ctx *fasthttp.RequestCtx) string {
	if c := counted(ctx); c != nil && c.remoteIP != "" {
		return c.remoteIP
	}
	return ctx.RemoteIP().String()
}

// counted returns the counted connection ctx is served on, or nil.
func counted(ctx *fasthttp.RequestCtx) *countedConn {
	switch c := ctx.Conn().(type) {
	case *countedConn:
		return c
	case countedTLSConn:
		return c.countedConn
	}
	return nil
}

// newOutcome starts the record of the request in ctx, whose headers have
// been read (or as far as they were, when fasthttp failed reading them).
func (p *Proxy) newOutcome(ctx *fasthttp.RequestCtx, start time.Time) *outcome {
	h := &ctx.Request.Header
	o := &outcome{
		ctx:      ctx,
		start:    start,
		id:       requestID(h.Peek(headerRequestID)),
		client:   clientAddr(ctx),
		xff:      logBytes(h.Peek("X-Forwarded-For")),
		ua:       logBytes(h.UserAgent()),
		method:   methodString(h.Method()),
		path:     string(ctx.Path()),
		endpoint: "other",
	}
	if h.IsPost() && oai.KindForPath(o.path) != oai.KindOther {
		o.endpoint = o.path
	}
	return o
}

// finish records the end of a request that entered Handle: every such
// request passes here exactly once, except an answer read whole, which
// relay records and heldBody (stream.go) takes out of flight (leave).
func (p *Proxy) finish(o *outcome) {
	p.leave(o)
	p.record(o)
}

// leave takes a request out of flight: out of limits.max_inflight's
// count and what flow control holds for it (its tenant's concurrency and
// share), waking the flow dispatcher.
// acquired runs o.unreserve once: the request holds a replica's
// in-flight slot, or ends.
func (o *outcome) acquired() {
	if o.unreserve != nil {
		o.unreserve()
		o.unreserve = nil
	}
}

func (p *Proxy) leave(o *outcome) {
	p.inflight.Add(-1)
	o.acquired()
	if o.flowDone != nil {
		o.flowDone()
		o.flowDone = nil
	}
	if p.live.Load().Flow.queues() {
		p.wakeFlow()
	}
}

// peekAfter is how long a buffered answer must have taken before record
// asks the client's socket whether it was closed meanwhile. The check is a
// system call; a client leaving within a faster answer is rare, and its
// answer is then logged as sent (the write fails on a closed socket).
const peekAfter = 20 * time.Millisecond

// record writes one request's access-log line and its metrics. An answer
// written whole before the handler returns (not streamed) is finished here:
// it gets its X-Request-Id and its size, and counts as 499 when the client
// closed its connection while the request was being served.
func (p *Proxy) record(o *outcome) {
	if !o.streamed && o.ctx != nil {
		ctx := o.ctx
		if o.status == 0 {
			o.status = ctx.Response.StatusCode()
		}
		if o.tries > 0 && o.status != statusClientGone && time.Since(o.start) >= peekAfter && peerClosed(ctx.Conn()) {
			o.status, o.err = statusClientGone, codeClientGone
			ctx.SetConnectionClose()
		}
		if o.status == statusClientGone {
			o.bytes = 0
		} else {
			o.bytes = int64(len(ctx.Response.Body()))
		}
		ctx.Response.Header.Set(headerRequestID, o.id)
	}
	total := time.Since(o.start)
	if o.ttfb == 0 && !o.streamed && o.status != statusClientGone {
		// A buffered answer is handed over whole: its first byte leaves now.
		o.ttfb = total
	}
	p.obs.Request(o.endpoint, o.replica, o.status, o.route, o.ttfb, total)
	if ce := p.access.Check(zap.InfoLevel, "request"); ce != nil {
		ce.Write(
			zap.String("request_id", o.id),
			zap.String("client", o.client),
			zap.String("x_forwarded_for", o.xff),
			zap.String("method", o.method),
			zap.String("path", logTrunc(o.path)), // o.path is a copy of its own
			zap.String("model", o.model),
			zap.String("replica", o.replica),
			prefillField(o.prefill),
			zap.String("route", o.route),
			zap.Int("status", o.status),
			zap.Int64("bytes", o.bytes),
			zap.Duration("ttfb", o.ttfb),
			zap.Duration("duration", total),
			zap.String("user_agent", o.ua),
			zap.Int("attempts", o.tries),
			zap.String("error", o.err),
			reuseField(ReuseDelivered, o.reuse.Delivered, o.reuseSeen),
			reuseField(ReuseRoutingLoss, o.reuse.RoutingLoss, o.reuseSeen),
			reuseField(ReuseIndexLoss, o.reuse.IndexLoss, o.reuseSeen),
			reuseField(ReuseWorkloadMiss, o.reuse.WorkloadMiss, o.reuseSeen),
		)
	}
}

// prefillField names a disaggregated request's prefill replica in its
// access line; the lines of other requests leave the field out.
func prefillField(name string) zap.Field {
	if name == "" {
		return zap.Skip()
	}
	return zap.String("prefill_replica", name)
}

// parseBuffers holds *oai.Buffers between requests, so parsing a chat
// request allocates nothing once warm.
var parseBuffers sync.Pool

// Handle serves one client request.
func (p *Proxy) Handle(ctx *fasthttp.RequestCtx) {
	o := p.newOutcome(ctx, time.Now())
	p.inflight.Add(1)
	opts := p.live.Load()
	var apiKey []byte // the tenant's key, read before admit consumes it
	if opts.Flow.Tenant.APIKey || opts.CacheSalt.From.APIKey {
		apiKey = append(apiKey, bearer(ctx.Request.Header.Peek("Authorization"))...)
	}
	if e := p.admit(ctx, opts); e != nil {
		p.fail(ctx, o, e)
		return
	}
	if p.refuseUnforwardable(ctx, o) { // forwardcheck.go
		return
	}
	if ctx.IsGet() && isModelsPath(o.path) {
		o.endpoint = pathModels
		if e := p.serveModels(ctx, o.path); e != nil {
			p.fail(ctx, o, e)
			return
		}
		o.status = ctx.Response.StatusCode()
		p.finish(o)
		return
	}
	body, e := p.readBody(ctx, opts) // body.go
	if e != nil {
		p.fail(ctx, o, e)
		ctx.SetConnectionClose() // what is left of the body is not read
		return
	}
	// The parsed request and every attempt's upstream write use the body
	// until forward returns; nothing reads it after Handle.
	defer p.releaseBody(ctx, body)
	var rreq router.Request
	routed := false
	if ctx.IsPost() {
		if kind := oai.KindForPath(o.path); kind != oai.KindOther {
			o.endpoint = o.path
			bufs, _ := parseBuffers.Get().(*oai.Buffers)
			if bufs == nil {
				bufs = new(oai.Buffers)
			}
			// Back to the pool once this request is handed off: nothing
			// reads the parsed request after Handle returns (a stream
			// relayed after it keeps only its decision and replica).
			defer parseBuffers.Put(bufs)
			if opts.CacheSalt.enabled() && salted(kind) {
				if e := setSalt(ctx, bufs, kind, apiKey, &opts.CacheSalt); e != nil {
					p.fail(ctx, o, e)
					return
				}
			}
			// The body is readBody's buffer (or the copy setSalt made). A
			// previous_response_id pins the request (see responses.go).
			parsed, err := p.router.Prepare(bufs, kind, ctx.Request.Body(), ctx.Request.Header.Peek(opts.SessionHeader), &rreq)
			if err != nil {
				p.fail(ctx, o, asOAI(err))
				return
			}
			o.model = logString(parsed.Model)
			routed = true
			tokens := rreq.Tokens
			if tokens == 0 {
				tokens = len(ctx.Request.Body()) / 4 // untokenized: about four bytes a token
			}
			fr := flowRequest{
				tenant:   tenantOf(ctx, parsed.User, apiKey, &opts.Flow.Tenant),
				priority: priorityOf(ctx, parsed.Priority, parsed.HasPriority, &opts.Flow),
				tokens:   tokens,
				bytes:    int64(len(ctx.Request.Body())),
				rreq:     &rreq,
			}
			if !p.gate(ctx, o, &fr, opts) {
				return
			}
		}
	}
	if !routed {
		rreq.ResponseID = responseIDOfPath(o.path) // /v1/responses/{id}: see responses.go
	}
	var pd *pairing
	if routed && opts.Disaggregation != "" && (rreq.Kind == oai.KindChat || rreq.Kind == oai.KindCompletion) {
		rreq.Leg = backends.RoleDecode
		if opts.Disaggregation == ProtocolVLLM {
			rreq.LocalPrefill = opts.LocalPrefill
		}
		pd = &pairing{p: p, ctx: ctx, o: o, rreq: &rreq, opts: opts, protocol: opts.Disaggregation, kind: rreq.Kind}
	}
	p.forward(ctx, o, &rreq, routed, opts, pd)
	p.router.Release(&rreq)
}

// admit applies the limits and authentication checked before any parsing.
func (p *Proxy) admit(ctx *fasthttp.RequestCtx, opts *Options) *oai.Error {
	if len(ctx.Request.Header.RequestURI()) > opts.MaxURLBytes {
		return oai.NewError(fasthttp.StatusRequestURITooLong, "invalid_request_error", "uri_too_long",
			"request URL exceeds limits.max_url_bytes ("+strconv.Itoa(opts.MaxURLBytes)+" bytes)")
	}
	if len(opts.APIKeys) > 0 {
		if !validKey(ctx.Request.Header.Peek("Authorization"), opts.APIKeys) {
			return oai.NewError(fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
				"missing or invalid API key: send Authorization: Bearer <key>")
		}
		ctx.Request.Header.Del("Authorization") // consumed here; not forwarded
	}
	if p.inflight.Load() > int64(opts.MaxInflight) {
		return oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "overloaded",
			"kvroute is at limits.max_inflight requests; retry later")
	}
	return nil
}

// validKey reports whether auth is "Bearer <k>" for one of keys, comparing
// every key in constant time.
func validKey(auth []byte, keys []string) bool {
	tok := bearer(auth)
	if tok == nil {
		return false
	}
	ok := 0
	for _, k := range keys {
		ok |= subtle.ConstantTimeCompare(tok, []byte(k))
	}
	return ok == 1
}

// bearer returns the token of an Authorization value "Bearer <token>"
// (the scheme in any case), or nil.
func bearer(auth []byte) []byte {
	const prefix = "Bearer "
	if len(auth) <= len(prefix) || !bytes.EqualFold(auth[:len(prefix)], []byte(prefix)) {
		return nil
	}
	return auth[len(prefix):]
}

func asOAI(err error) *oai.Error {
	var e *oai.Error
	if errors.As(err, &e) {
		return e
	}
	return oai.BadRequest(err.Error(), "")
}

func (p *Proxy) fail(ctx *fasthttp.RequestCtx, o *outcome, e *oai.Error) {
	writeError(ctx, e)
	o.status = e.Status
	o.err = e.Code
	p.finish(o)
}

// forward runs the attempts of one request: route, send, and on a failure
// before any response byte, try another replica.
//
// A request of a disaggregated fleet (pd not nil) is routed on its decode
// leg, and pd runs the prefill side before each attempt (disagg.go).
func (p *Proxy) forward(ctx *fasthttp.RequestCtx, o *outcome, rreq *router.Request, routed bool, opts *Options, pd *pairing) {
	up := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(up)
	copyRequestHeaders(ctx, up, o.id)
	up.Header.SetMethodBytes(ctx.Method())
	// The body is sent byte for byte. It aliases readBody's buffer, which
	// stays valid until Handle returns; the upstream write is done by
	// then, on every path.
	up.SetBodyRaw(ctx.Request.Body())
	if pd != nil {
		pd.up = up
		defer pd.stop()
	}

	var triedBuf [4]*backends.Replica
	// The saturated replicas flow control keeps the request off (flow.go)
	// come first, counted as tried, until no other is left.
	tried := append(triedBuf[:0], o.avoid...)
	avoided := len(o.avoid)
	var lastErr *oai.Error
	var pools fullPools // see poolfull.go
	for attempt := 0; attempt <= opts.Retries; attempt++ {
		var dec router.Decision
		var err error
		pools.route(rreq)
		if routed {
			dec, err = p.router.Route(rreq, tried)
		} else {
			dec, err = p.router.PassThrough(rreq, tried)
		}
		if err != nil {
			if errors.Is(err, router.ErrNoReplica) && avoided > 0 {
				tried = append(tried[:0], tried[avoided:]...) // the saturated ones, rather than none
				avoided = 0
				attempt--
				continue
			}
			if errors.Is(err, router.ErrNoReplica) && pools.wait() {
				attempt-- // any replica left has a full pool: wait on one
				continue
			}
			if lastErr == nil || errors.Is(err, router.ErrUnknownModel) {
				lastErr = routeError(err, rreq.Model)
			}
			break
		}
		if pd != nil && pd.prefillFirst(&dec) {
			// vLLM: the prefill runs first, and the decode replica is
			// chosen once it is done, by its load then: a prefill may wait
			// long in its replica's queue, and the decode loads it would
			// have been chosen by are gone by the time its KV is ready.
			dec.Undo()
			if _, err = pd.prepare(&dec); err != nil {
				if pd.refused(err) {
					return
				}
				lastErr = asOAI(err)
				break
			}
			rreq.Prefilled = true // paired now
			attempt--             // the prefill is no decode attempt
			continue
		}
		pools.sent()
		if o.tries == 0 && routed && pd == nil {
			p.obs.Decision(time.Since(o.start), dec.Matched, rreq.Tokens)
			if rreq.Tokens > 0 {
				p.observeBest(dec.Matched, dec.Best)
			}
		}
		rep := dec.Replica
		o.matched, o.best, o.exact = dec.Matched, dec.Best, rreq.ExactTokens
		var acquired func() // the decode replica's in-flight slot, held from before its prefill
		if pd != nil {
			// Counted on the decode replica while an SGLang prefill runs
			// (both start at once), so that the requests decided meanwhile
			// see the decodes it will take.
			acquired = rep.Acquire()
			o.acquired()
			var body []byte
			if dec.Local && pd.body == nil {
				body, err = pd.local(&dec)
			} else {
				body, err = pd.prepare(&dec)
			}
			if err != nil {
				acquired()
				dec.Undo()
				if pd.refused(err) {
					return
				}
				lastErr = asOAI(err)
				break
			}
			up.SetBodyRaw(body)
		}
		tried = append(tried, rep)
		o.tries++
		o.replica, o.route = rep.Name(), dec.Reason
		rep.SetRequestURI(up, ctx.Request.Header.RequestURI())

		if acquired == nil {
			acquired = rep.Acquire()
			o.acquired()
		}
		release := dec.Dispatched(acquired)
		resp := fasthttp.AcquireResponse()
		if pd != nil && !rreq.Stream {
			// A disaggregated answer the client did not ask to stream is
			// awaited on a connection the client's leaving closes (the
			// pairing's watch): the decode is called off with its prefill.
			err = rep.Exchange(pd.client.Context(), up, resp, opts.MaxBufferedResponseBytes)
			if e := pd.decodeError(err); e != nil {
				release()
				fasthttp.ReleaseResponse(resp)
				dec.Undo()
				lastErr = e
				break
			}
		} else {
			resp.StreamBody = true
			err = rep.Client().Do(up, resp)
		}
		if err != nil {
			noConn := errors.Is(err, fasthttp.ErrNoFreeConns)
			if !noConn {
				// Only the replica's faults count towards its ejection (see
				// backends.IsReplicaFault; ReportFailure ignores the
				// others), counted before the in-flight slot goes.
				rep.ReportFailure(err)
			}
			release()
			fasthttp.ReleaseResponse(resp)
			dec.Undo()
			lastErr = upstreamError(err, shownReplica(rep.Name(), opts))
			if noConn {
				// No connection freed within limits.conn_wait: load, not
				// a fault, and no retry spent; another replica may have one.
				pools.waited()
				attempt--
				continue
			}
			if attempt < opts.Retries && !dec.Pinned {
				p.obs.Retry(rep.Name())
			}
			p.log.Debug("attempt failed", zap.String("replica", rep.Name()), zap.Error(err))
			continue
		}
		// No status below 200: the replica client refuses a 101 in its
		// head (backends.ErrBadResponseHead) and reads past the others.
		status := resp.StatusCode()
		if status >= 500 {
			// A 5xx counts towards ejection whether or not it is retried,
			// like a failed dial or a timeout on the last attempt.
			rep.ReportFailure(statusError(status))
		} else {
			rep.ReportSuccess()
		}
		if status >= 500 && attempt < opts.Retries && !dec.Pinned { // a pinned replica's answer stands
			p.obs.Retry(rep.Name())
			resp.SetConnectionClose()
			_ = resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
			release()
			dec.Undo()
			lastErr = oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_error",
				shownReplica(rep.Name(), opts)+" answered status "+strconv.Itoa(status))
			continue
		}
		if pd != nil && status < 400 {
			pd.answered(&dec)
		}
		p.relay(ctx, o, resp, release, &dec, rreq, opts)
		return
	}
	if lastErr == nil {
		lastErr = routeError(router.ErrNoReplica, rreq.Model)
	}
	p.fail(ctx, o, lastErr)
}

// statusError is the failure a replica's status (a 5xx, or an answer
// kvroute cannot use) counts as (Replica.ReportFailure).
func statusError(status int) error { return errors.New("status " + strconv.Itoa(status)) }

func routeError(err error, model string) *oai.Error {
	if errors.Is(err, router.ErrUnknownModel) {
		return modelNotFound(model)
	}
	return oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "no_replica_available",
		"no replica is available to serve this request; retry later")
}

// shownReplica is how an error body names a replica: "replica <name>", or
// "a replica" when opts hide backend names.
func shownReplica(name string, opts *Options) string {
	if opts.HideBackendNames {
		return "a replica"
	}
	return "replica " + name
}

// upstreamError classifies an error of sending to a replica or waiting for
// its response headers; who names the replica (see shownReplica).
func upstreamError(err error, who string) *oai.Error {
	var netErr net.Error
	switch {
	case errors.Is(err, errBadResponseHead): // forwardcheck.go
		return oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_bad_response",
			who+" sent a malformed or unsupported response head")
	case errors.Is(err, fasthttp.ErrTimeout) || errors.As(err, &netErr) && netErr.Timeout():
		return oai.NewError(fasthttp.StatusGatewayTimeout, "upstream_error", "replica_timeout",
			who+" did not answer in time")
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		// The pool of every replica tried was full (limits.max_conns_per_replica)
		// for limits.conn_wait; writeError adds Retry-After.
		return oai.NewError(fasthttp.StatusServiceUnavailable, "service_unavailable", "replica_busy",
			who+" has no free connection (limits.max_conns_per_replica); retry later")
	}
	return oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_unreachable",
		who+" could not be reached or closed the connection")
}

var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// relay sends a replica's response to the client. An answer of known
// length up to opts.MaxBufferedResponseBytes is read whole first, which
// keeps its framing exact and hands the replica connection back at once;
// its access-log line and metrics are recorded when it is handed to
// fasthttp, which writes it once the handler returns, and it counts as in
// flight until written (heldBody, stream.go). Any other body (server-sent
// events, one of unknown length, a larger answer, whose Content-Length is
// kept) is relayed as it arrives by a streamRelay (stream.go), and the
// request stays in flight until the client has its last byte. Every write to the client must complete within
// opts.ClientWriteTimeout (the server's WriteTimeout bounds the answers
// kvroute writes itself). release, the response and the decision are
// settled on every path.
func (p *Proxy) relay(ctx *fasthttp.RequestCtx, o *outcome, resp *fasthttp.Response, release func(), dec *router.Decision, rreq *router.Request, opts *Options) {
	copyResponseHeaders(resp, &ctx.Response.Header)
	ctx.Response.Header.Set(headerRequestID, o.id)
	if !opts.HideBackendNames {
		ctx.Response.Header.Set(headerBackend, dec.Replica.Name())
		if dec.Reason != "" && opts.ExposeRouteReason {
			ctx.Response.Header.Set(headerRoute, dec.Reason)
		}
	}
	o.status = resp.StatusCode()
	// The write deadline covers what fasthttp writes once the handler
	// returns: the headers and a buffered body. A relay moves it on before
	// each of its writes. Set through ctx, it is cleared after the response.
	writeDeadline := time.Now().Add(opts.ClientWriteTimeout)
	_ = ctx.SetWriteDeadline(writeDeadline)
	sse := isEventStream(resp.Header.ContentType())
	bs := resp.BodyStream()
	size := resp.Header.ContentLength()
	if bs == nil || !sse && size >= 0 && size <= opts.MaxBufferedResponseBytes {
		// A small body of known length is read whole (engines send the
		// headers of a non-streamed answer when it is done); none at all
		// (HEAD, 204, 304) settles at once.
		dec.Started()
		var body []byte
		var err error
		if bs != nil {
			body, err = readBody(bs, size)
		} else {
			body = append(body, resp.Body()...)
		}
		if err != nil {
			resp.SetConnectionClose()
		}
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		if err != nil {
			dec.Replica.ReportFailure(err) // before its in-flight slot goes
		}
		release()
		if err != nil {
			p.fail(ctx, o, oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_body_error",
				shownReplica(dec.Replica.Name(), opts)+" failed while sending its response"))
			return
		}
		ctx.Response.SetBodyRaw(body)
		o.bytes = int64(len(body))
		p.observeUsage(o, dec, body)
		p.noteResponse(ctx, dec.Replica, o.status, body)
		if len(body) == 0 {
			p.finish(o)
			return
		}
		// Recorded now, in flight until written: see heldBody.
		p.record(o)
		ctx.Response.SetBodyStream(&heldBody{p: p, o: o, b: body}, len(body))
		return
	}
	if !sse {
		// Engines send the headers of a non-streamed answer when it is done.
		dec.Started()
	}
	o.streamed = true
	// fasthttp's connection goroutine pulls the body through WriteTo and
	// writes each piece as it comes: no pipe, no extra goroutine. The
	// client connection is kept to abort a non-SSE body whose replica fails
	// mid-way: ending it cleanly would pass a truncated body as complete.
	s := &streamRelay{
		p: p, o: o, resp: resp, body: &firstByte{r: bs, o: o}, release: release,
		dec: dec, sse: sse, clientConn: ctx.Conn(),
		ids:       p.responseScanner(ctx, dec.Replica, o.status),
		writeWait: opts.ClientWriteTimeout, writeDeadline: writeDeadline,
	}
	if sse {
		// The usage event comes last, after Handle returned: the key
		// stays valid for Decision.Feedback until the stream closes.
		s.key = p.router.Hold(rreq)
		p.takeStream(s, ctx)
	}
	if !sse && size >= 0 {
		// An answer too large to buffer keeps its length; its first bytes
		// are kept for the Responses-API table (responses.go).
		s.keepHead = isResponsesPath(ctx.Path())
		ctx.Response.SetBodyStream(s, size)
		return
	}
	// Each piece of a stream goes out as one chunk, flushed at once.
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.SetBodyStream(s, -1)
}

// observeUsage reports an engine's cached-token count found in b next to
// the Index's prediction for this request, and gives it to the decision,
// which trims the Index when the engine found less (Decision.Feedback).
func (p *Proxy) observeUsage(o *outcome, dec *router.Decision, b []byte) {
	if o.usageSeen {
		return
	}
	if prompt, cached, ok := scanUsage(b); ok {
		p.obs.Cached(o.matched, cached, prompt, dec.Precise)
		p.observeReuse(o, dec.Replica.Name(), prompt, cached, o.matched, o.best)
		dec.Replica.NoteTokenCounts(o.exact, prompt)
		dec.Feedback(prompt, cached)
	}
}

// firstByte reads a relayed stream and notes when its first byte came, the
// stream's time to first byte (for a chat stream, to its first token).
type firstByte struct {
	r io.Reader
	o *outcome
}

func (f *firstByte) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if n > 0 && f.o.ttfb == 0 {
		f.o.ttfb = time.Since(f.o.start)
	}
	return n, err
}

// streamErrorEvent is the in-band error that ends an SSE stream whose
// replica failed. It names no replica whatever the options say: when
// names are shown, the response's X-Kvroute-Backend header already did.
func streamErrorEvent(string) string {
	e := oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "stream_interrupted",
		"the replica stopped sending before the stream ended")
	return "data: " + string(e.Body()) + "\n\n"
}

func isEventStream(ct []byte) bool {
	const es = "text/event-stream"
	return len(ct) >= len(es) && string(ct[:len(es)]) == es
}

// readBody reads a whole response body of the given length (the
// response's Content-Length) into one buffer of that size.
func readBody(r io.Reader, size int) ([]byte, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}
