package precise

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/maphash"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/outcomes"
)

// Errors a Render call returns (wrapped) when the caller is to route on
// the approximate key instead.
var (
	// ErrRenderTimeout: the deadline passed before the tokens came.
	ErrRenderTimeout = errors.New("precise: render deadline passed")
	// ErrRenderNotServed: neither the render endpoint nor /tokenize is
	// served at the render URL.
	ErrRenderNotServed = errors.New("precise: render endpoints not served")
	// ErrRenderUnsupported: the request's kind has no render endpoint
	// here (only chat and completions requests are rendered).
	ErrRenderUnsupported = errors.New("precise: request kind not rendered")
	// ErrRenderUnkeyed: the engine keys the request's blocks by more than
	// its tokens and salt (multimodal data), so that its tokens alone
	// would match blocks of other data: it is not given exact tokens. Such
	// blocks are not placed from events either. A request whose routing
	// fields were truncated (oai.Request.Truncated) is not either. A
	// cache_salt does not make a request unkeyed: its tokens do not depend
	// on it, and its exact key starts from tokenize.SaltedName.
	ErrRenderUnkeyed = errors.New("precise: request's blocks are keyed by more than its tokens")
	// ErrRenderBehind: most of the latest renders took longer than the
	// timeout, so the request did not wait for its own (see rdBehindMin).
	ErrRenderBehind = errors.New("precise: the renderer is behind")
)

// Defaults of RenderOptions.
const (
	DefaultRenderTimeout     = 20 * time.Millisecond
	DefaultRenderCacheBytes  = 64 << 20
	DefaultRenderCacheTTL    = 5 * time.Minute
	DefaultRenderReprobe     = 30 * time.Second
	DefaultRenderMaxConns    = 256
	DefaultRenderPrefixAfter = 8
)

// Bounds of the renders a prefix-served call leaves to the background
// (RenderPrefix): at most rdVerifyMax at once, each within rdVerifyTimeout
// (no request waits for them).
const (
	rdVerifyMax = 64
	// rdBehindMin: once most of the latest renders (outcomes.Size, at
	// least rdBehindMin of them) took longer than the timeout, a call
	// waits for none (ErrRenderBehind): it would wait the whole timeout
	// to fall back all the same. Its render runs in the background when a
	// slot is free, cached for the next turn, and its time tells when the
	// renderer keeps up again.
	rdBehindMin = 8
	// rdBehindMax bounds the renders of calls that did not wait, in flight
	// at once: a renderer that is behind (an engine's API server, often)
	// gets a few renders to tell its pace by, not one per request on top
	// of its backlog, which would keep it behind.
	rdBehindMax     = 2
	rdVerifyTimeout = 2 * time.Second
)

// rdMaxPooledBody is the capacity above which a /tokenize request body is
// left to the garbage collector rather than kept for the next.
const rdMaxPooledBody = 1 << 20

// rdMaxResponseBytes bounds a render or tokenize answer (about a million
// tokens as JSON).
const rdMaxResponseBytes = 16 << 20

// RenderOptions configures a Renderer.
type RenderOptions struct {
	// URL is the base URL of the engine's renderer: a replica or a
	// GPU-less render process, http or https, with an optional path prefix.
	URL string
	// Timeout bounds every Render call (DefaultRenderTimeout when 0): past
	// it the call returns ErrRenderTimeout and the caller routes on the
	// approximate key.
	Timeout time.Duration
	// CacheBytes bounds the memory of the render cache
	// (DefaultRenderCacheBytes when 0; no cache when negative).
	CacheBytes int64
	// CacheTTL is how long a cached render answers for its body
	// (DefaultRenderCacheTTL when 0): a template may render the date, and
	// an engine restarted with another template renders differently.
	CacheTTL time.Duration
	// ReprobeEvery is how often the render endpoint is tried again once it
	// answered as not served (DefaultRenderReprobe when 0).
	ReprobeEvery time.Duration
	// MaxConns bounds the connections to the renderer
	// (DefaultRenderMaxConns when 0). A call that finds them all busy
	// waits for one within its deadline.
	MaxConns int
	// TLSConfig is used for an https URL (nil: the system's roots).
	TLSConfig *tls.Config
	// PrefixAfter is how many next turns in a row must have rendered with
	// their previous turn's tokens as a prefix (Stable) before RenderPrefix
	// answers a next turn from its previous turn's render at once
	// (DefaultRenderPrefixAfter when 0; never when negative). One that did
	// not (Unstable) starts the count again.
	PrefixAfter int
	// Log receives the switches between render and /tokenize (nil: none).
	Log *zap.Logger
}

// Renderer asks an engine's renderer for the exact prompt tokens of
// requests (see Render). It is safe for concurrent use.
type Renderer struct {
	timeout, reprobe time.Duration
	// pace holds whether the latest renders (those run by runLate) took
	// longer than the timeout: see rdBehindMin.
	pace        outcomes.Window
	log         *zap.Logger
	client      *fasthttp.HostClient
	chatURL     string
	complURL    string
	tokenizeURL string
	cache       *rdCache // nil: none

	// tokenizeOnly is set once the render endpoint answered as not served;
	// nextProbe (unix nanoseconds) is when a call tries it again.
	tokenizeOnly atomic.Bool
	nextProbe    atomic.Int64

	parsers fastjson.ParserPool
	bufs    sync.Pool // *oai.Buffers
	bodies  sync.Pool // *[]byte, request bodies of /tokenize and of renders that may outlive their call
	toks    sync.Pool // *[]uint32, the answers of renders that may outlive their call
	st      renderCounters

	// prefixAfter is RenderOptions.PrefixAfter (0: never); stableRun the
	// next turns in a row that rendered Stable.
	prefixAfter int64
	stableRun   atomic.Int64
	// verifying holds a slot per background render (startBackground);
	// verifies waits for them at Close.
	verifying chan struct{}
	verifies  sync.WaitGroup
	// behind holds a slot per render of a call that did not wait
	// (rdBehindMax).
	behind chan struct{}
}

// rdHTTPS is the scheme of a render URL served over TLS.
const rdHTTPS = "https"

// NewRenderer returns a Renderer of the renderer at o.URL. Nothing is
// dialed until the first call.
func NewRenderer(o RenderOptions) (*Renderer, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("precise: render url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != rdHTTPS || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("precise: render url %q: want http(s)://host[:port][/prefix]", o.URL)
	}
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == rdHTTPS {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	r := &Renderer{
		timeout: rdOr(o.Timeout, DefaultRenderTimeout),
		reprobe: rdOr(o.ReprobeEvery, DefaultRenderReprobe),
		log:     o.Log,

		verifying: make(chan struct{}, rdVerifyMax),
		behind:    make(chan struct{}, rdBehindMax),
	}
	if o.PrefixAfter >= 0 {
		r.prefixAfter = int64(rdOr(o.PrefixAfter, DefaultRenderPrefixAfter))
	}
	if r.log == nil {
		r.log = zap.NewNop()
	}
	base := u.Scheme + "://" + u.Host + strings.TrimSuffix(u.EscapedPath(), "/")
	r.chatURL = base + "/v1/chat/completions/render"
	r.complURL = base + "/v1/completions/render"
	r.tokenizeURL = base + "/tokenize"
	r.client = &fasthttp.HostClient{
		Addr:                     addr,
		Name:                     "kvroute",
		IsTLS:                    u.Scheme == rdHTTPS,
		TLSConfig:                o.TLSConfig,
		MaxConns:                 rdOr(o.MaxConns, DefaultRenderMaxConns),
		MaxConnWaitTimeout:       r.timeout,
		MaxIdleConnDuration:      time.Minute,
		MaxResponseBodySize:      rdMaxResponseBytes,
		NoDefaultUserAgentHeader: true,
		// A render has no side effect: a request that met a kept-alive
		// connection the renderer had closed is sent again, once, within
		// the same deadline.
		RetryIfErr: func(_ *fasthttp.Request, attempts int, err error) (bool, bool) {
			return false, attempts < 2 && !rdIsTimeout(err)
		},
	}
	if o.CacheBytes >= 0 {
		limit := o.CacheBytes
		if limit == 0 {
			limit = DefaultRenderCacheBytes
		}
		r.cache = newRDCache(limit, rdOr(o.CacheTTL, DefaultRenderCacheTTL))
	}
	return r, nil
}

func rdOr[T int | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Timeout is the deadline every Render call is bounded by.
func (r *Renderer) Timeout() time.Duration { return r.timeout }

// Close waits for the background renders of prefix-served calls (each
// within rdVerifyTimeout) and closes the Renderer's idle connections.
func (r *Renderer) Close() {
	r.verifies.Wait()
	r.client.CloseIdleConnections()
}

// Render appends to dst the exact prompt token ids of the request body of
// kind (chat or completions) and returns it, as the engine's renderer
// renders them; see RenderRequest. It parses body itself: a caller that
// has parsed it already calls RenderRequest.
func (r *Renderer) Render(ctx context.Context, kind oai.Kind, body []byte, dst []uint32) ([]uint32, error) {
	out, _, err := r.parseRender(ctx, kind, body, dst, false)
	return out, err
}

// RenderPrefix is Render, except for a chat request whose conversation's
// previous turn (or, while that one's render runs, an earlier one, up to
// rdPrevDepth messages back) is in the cache while the renderer has
// rendered RenderOptions.PrefixAfter next turns in a row with their previous
// turn's tokens as a prefix: it then answers at once with those tokens but
// their last one (exact tokens of a prefix of the prompt, whole false),
// and renders the request in the background, to cache it for the next
// turn and to check the prefix again. whole is true when toks are the
// prompt's tokens.
func (r *Renderer) RenderPrefix(ctx context.Context, kind oai.Kind, body []byte, dst []uint32) (toks []uint32, whole bool, err error) {
	return r.parseRender(ctx, kind, body, dst, true)
}

// getBufs returns parse buffers from the pool, to be put back after.
func (r *Renderer) getBufs() *oai.Buffers {
	if b, ok := r.bufs.Get().(*oai.Buffers); ok {
		return b
	}
	return new(oai.Buffers)
}

// parseRender parses body and renders it; see RenderPrefix for prefix.
func (r *Renderer) parseRender(ctx context.Context, kind oai.Kind, body []byte, dst []uint32, prefix bool) ([]uint32, bool, error) {
	start := time.Now()
	bufs := r.getBufs()
	defer r.bufs.Put(bufs)
	req, err := bufs.Parse(kind, body)
	if err != nil {
		r.st.fbError.Add(1)
		r.record(start, err)
		return dst, false, fmt.Errorf("precise: render: %w", err)
	}
	return r.render(ctx, start, req, body, dst, prefix)
}

// servePrefix answers a chat request whose cache lookup found no entry
// but an earlier turn's, prev, with prev's tokens but the last, when
// RenderPrefix may (see there), and starts the background render; ok is
// false when it may not. When rdVerifyMax background renders are running
// already, it answers all the same and makes none (Unverified): the
// renderer is behind, and a render more would only queue behind the
// others while this request waited for its own. The conversation's next
// turn then finds prev again, up to rdPrevDepth messages back.
func (r *Renderer) servePrefix(keys rdKeys, prev *rdEntry, req *oai.Request, body []byte, dst []uint32) (out []uint32, ok bool) {
	if r.prefixAfter <= 0 || req.Kind != oai.KindChat || len(prev.toks) < 2 || r.stableRun.Load() < r.prefixAfter {
		return dst, false
	}
	r.st.prefix.Add(1)
	if r.startBackground() {
		go r.verify(keys, prev, req.Kind, slices.Clone(body))
	} else {
		r.st.unverified.Add(1)
	}
	return append(dst, prev.toks[:len(prev.toks)-1]...), true
}

// startBackground takes one of the rdVerifyMax slots of the renders that
// run in the background (those of prefix-served calls, and those that may
// outlive their call), for Close to wait for; false when all are taken.
// Every true is followed by one endBackground.
func (r *Renderer) startBackground() bool {
	select {
	case r.verifying <- struct{}{}:
		r.verifies.Add(1)
		return true
	default:
		return false
	}
}

// endBackground gives back the slot of startBackground.
func (r *Renderer) endBackground() {
	<-r.verifying
	r.verifies.Done()
}

// verify renders body, a request answered by servePrefix from prev, within
// rdVerifyTimeout, compares it with prev (Stable or Unstable, which also
// moves stableRun) and caches it for the conversation's next turn.
func (r *Renderer) verify(keys rdKeys, prev *rdEntry, kind oai.Kind, body []byte) {
	defer r.endBackground()
	start := time.Now()
	bufs := r.getBufs()
	defer r.bufs.Put(bufs)
	req, err := bufs.Parse(kind, body)
	if err == nil {
		var toks []uint32
		if toks, err = r.fetch(start.Add(rdVerifyTimeout), req.Kind, body, nil); err == nil {
			r.keep(&keys, prev, toks, start.UnixNano())
			return
		}
	}
	r.st.verifyFailed.Add(1)
}

// keep caches toks, a new render of keys, comparing it with the previous
// turn's render prev (nil if none) first. The cache keeps toks.
func (r *Renderer) keep(keys *rdKeys, prev *rdEntry, toks []uint32, now int64) {
	if prev != nil {
		r.compareTurns(prev.toks, toks)
	}
	r.cache.store(keys, toks, prev, now)
}

// RenderRequest appends to dst the exact prompt token ids of req, parsed
// from body (oai.Parse), and returns it:
//
//   - a completions request whose prompt is one list of token ids: those,
//     as given, without a call;
//   - a request whose body was rendered before (a retry, a repeated
//     prompt): the cached tokens (see RenderOptions.CacheBytes);
//   - a chat request: POST /v1/chat/completions/render with body as is,
//     a completions request: POST /v1/completions/render (the first
//     prompt's tokens of the array it answers); where the render endpoint
//     answers 404 or 405 without an OpenAI error body (not served), POST
//     /tokenize with the body's messages (or prompt) and the fields of it
//     that shape the rendering, for this and later calls (the render
//     endpoint is tried again every RenderOptions.ReprobeEvery).
//
// It returns within the Timeout (or ctx's deadline when earlier); on an
// error (ErrRenderTimeout, ErrRenderNotServed, ErrRenderUnsupported,
// ErrRenderUnkeyed or another) dst is returned as given and the caller
// routes on the approximate key. body must not change during the call;
// nothing keeps it after.
func (r *Renderer) RenderRequest(ctx context.Context, req *oai.Request, body []byte, dst []uint32) ([]uint32, error) {
	out, _, err := r.render(ctx, time.Now(), req, body, dst, false)
	return out, err
}

// RenderPending is a render begun by Start.
type RenderPending struct {
	done chan struct{}
	toks []uint32
	err  error
}

// Start begins RenderRequest(ctx, req, body) and returns at once, so that
// the caller can compute the approximate key (its fallback) while the
// renderer answers. req and body must stay valid and unchanged until Wait
// returns (Start only reads them); every Start is to be followed by one
// Wait.
func (r *Renderer) Start(ctx context.Context, req *oai.Request, body []byte) *RenderPending {
	p := &RenderPending{done: make(chan struct{})}
	start := time.Now() // the deadline runs from here, not from when the goroutine runs
	go func() {
		defer close(p.done)
		p.toks, _, p.err = r.render(ctx, start, req, body, nil, false)
	}()
	return p
}

// Wait appends the tokens of the render begun by Start to dst and returns
// it, or returns dst and the render's error. It returns by the render's
// deadline.
func (p *RenderPending) Wait(dst []uint32) ([]uint32, error) {
	<-p.done
	if p.err != nil {
		return dst, p.err
	}
	return append(dst, p.toks...), nil
}

// render renders req and counts the call; with prefix, a next turn may be
// answered from its previous turn (RenderPrefix), whole then false.
func (r *Renderer) render(ctx context.Context, start time.Time, req *oai.Request, body []byte, dst []uint32, prefix bool) (out []uint32, whole bool, err error) {
	out, whole, err = r.renderTimed(ctx, start, req, body, dst, prefix)
	r.record(start, err)
	return out, whole, err
}

// record counts the end of a call begun at start.
func (r *Renderer) record(start time.Time, err error) {
	end := time.Now()
	r.st.latency.record(end.Sub(start))
	switch {
	case errors.Is(err, ErrRenderUnkeyed), errors.Is(err, ErrRenderBehind):
		// The request cannot be keyed by tokens, or did not wait for its
		// render: no failure of the renderer.
	case err != nil:
		r.st.lastFallback.Store(end.UnixNano())
	default:
		r.st.lastSuccess.Store(end.UnixNano())
	}
}

func (r *Renderer) renderTimed(ctx context.Context, start time.Time, req *oai.Request, body []byte, dst []uint32, prefix bool) ([]uint32, bool, error) {
	deadline := start.Add(r.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := ctx.Err(); err != nil {
		r.st.fbTimeout.Add(1)
		return dst, false, fmt.Errorf("%w: %w", ErrRenderTimeout, err)
	}
	if req.Truncated && (req.Kind == oai.KindChat || req.Kind == oai.KindCompletion) {
		r.st.fbUnkeyed.Add(1)
		return dst, false, fmt.Errorf("%w: the request's routing fields are truncated", ErrRenderUnkeyed)
	}
	switch req.Kind {
	case oai.KindChat:
		if rdHasData(req) {
			r.st.fbUnkeyed.Add(1)
			return dst, false, fmt.Errorf("%w: a message has a part other than text", ErrRenderUnkeyed)
		}
	case oai.KindCompletion:
		if len(req.Prompt.Tokens) == 1 && len(req.Prompt.Texts) == 0 {
			r.st.pass.Add(1)
			return append(dst, req.Prompt.Tokens[0]...), true, nil
		}
	default:
		r.st.fbError.Add(1)
		return dst, false, fmt.Errorf("%w: %s", ErrRenderUnsupported, req.Kind)
	}

	var keys rdKeys
	var prev *rdEntry
	now := start.UnixNano()
	if r.cache != nil {
		keys = rdKeysOf(req, body)
		var hit *rdEntry
		if hit, prev = r.cache.lookup(&keys, now); hit != nil {
			r.st.hits.Add(1)
			return append(dst, hit.toks...), true, nil
		}
		if prefix && prev != nil {
			if out, ok := r.servePrefix(keys, prev, req, body, dst); ok {
				return out, false, nil
			}
		}
	}

	if r.cache != nil && r.pace.Mostly(rdBehindMin) {
		r.st.fbBehind.Add(1)
		select {
		case r.behind <- struct{}{}:
			if r.startBackground() {
				r.startLate(rdLateAbandoned, true, start, keys, prev, req.Kind, body)
			} else {
				<-r.behind
			}
		default:
		}
		return dst, false, ErrRenderBehind
	}
	out, err := r.fetchOrLate(deadline, start, keys, prev, req.Kind, body, dst)
	if err != nil {
		switch {
		case errors.Is(err, ErrRenderTimeout):
			r.st.fbTimeout.Add(1)
		case errors.Is(err, ErrRenderNotServed):
			r.st.fbNotServed.Add(1)
		case errors.Is(err, ErrRenderUnkeyed):
			r.st.fbUnkeyed.Add(1)
		default:
			r.st.fbError.Add(1)
		}
		return dst, false, err
	}
	if r.cache != nil {
		r.keep(&keys, prev, slices.Clone(out[len(dst):]), now)
	}
	return out, true, nil
}

// rdLate is a render begun by fetchOrLate that may outlive its call: state
// says who takes its answer (rdLateWaiting until one of the sides claims
// it).
type rdLate struct {
	state atomic.Int32
	done  chan rdLateAnswer // buffered: the render never waits for the call
	// behind: the render holds a slot of Renderer.behind.
	behind bool
}

// rdLateAnswer is a render's answer: its tokens in a buffer of
// Renderer.toks, which the taker puts back.
type rdLateAnswer struct {
	toks *[]uint32
	err  error
}

// States of an rdLate.
const (
	rdLateWaiting   int32 = iota
	rdLateDelivered       // the call takes the answer
	rdLateAbandoned       // the call returned at its deadline; the render keeps the answer
)

// fetchOrLate is fetch within deadline, except that with a cache and a
// free background slot the render runs on, within rdVerifyTimeout of
// start, after the deadline has passed: the call returns
// ErrRenderTimeout at its deadline and routes on the approximate key, and
// the render's answer, when it comes, is cached (Late) so that the
// conversation's next turn finds its previous turn rendered. A slow
// renderer then still serves next turns from their previous turn's
// tokens, where without it every turn would miss its deadline alike.
func (r *Renderer) fetchOrLate(deadline, start time.Time, keys rdKeys, prev *rdEntry, kind oai.Kind, body []byte, dst []uint32) ([]uint32, error) {
	if r.cache == nil {
		return r.fetch(deadline, kind, body, dst)
	}
	if !r.startBackground() {
		return r.fetch(deadline, kind, body, dst)
	}
	late := r.startLate(rdLateWaiting, false, start, keys, prev, kind, body)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	var a rdLateAnswer
	select {
	case a = <-late.done:
	case <-timer.C:
		if late.state.CompareAndSwap(rdLateWaiting, rdLateAbandoned) {
			return dst, fmt.Errorf("%w: the render goes on for the next turn", ErrRenderTimeout)
		}
		a = <-late.done // delivered as the deadline passed
	}
	dst = append(dst, *a.toks...)
	r.toks.Put(a.toks)
	return dst, a.err
}

// startLate renders a copy of body in the background (runLate), on a slot
// startBackground took, its answer going through the rdLate returned,
// whose state starts as given: rdLateWaiting for a call that waits for it,
// rdLateAbandoned for one that did not (its answer is cached for the next
// turn); behind says it holds a slot of Renderer.behind, given back when
// it ends.
func (r *Renderer) startLate(state int32, behind bool, start time.Time, keys rdKeys, prev *rdEntry, kind oai.Kind, body []byte) *rdLate {
	late := &rdLate{done: make(chan rdLateAnswer, 1), behind: behind}
	late.state.Store(state)
	bp := r.getBody()
	*bp = append((*bp)[:0], body...)
	go r.runLate(late, start, keys, prev, kind, bp)
	return late
}

// runLate renders the body in bp for fetchOrLate and hands the answer to
// the call, or, once the call has returned, caches it as Late (or counts
// a failure in VerifyFailed).
func (r *Renderer) runLate(late *rdLate, start time.Time, keys rdKeys, prev *rdEntry, kind oai.Kind, bp *[]byte) {
	defer func() {
		r.putBody(bp)
		if late.behind {
			<-r.behind
		}
		r.endBackground()
	}()
	tp, _ := r.toks.Get().(*[]uint32)
	if tp == nil {
		tp = new([]uint32)
	}
	var err error
	*tp, err = r.fetch(start.Add(rdVerifyTimeout), kind, *bp, (*tp)[:0])
	if err == nil || errors.Is(err, ErrRenderTimeout) {
		r.pace.Note(time.Since(start) > r.timeout)
	}
	if late.state.CompareAndSwap(rdLateWaiting, rdLateDelivered) {
		late.done <- rdLateAnswer{tp, err}
		return
	}
	defer r.toks.Put(tp)
	if err != nil {
		r.st.verifyFailed.Add(1)
		return
	}
	r.st.late.Add(1)
	// The renderer answered, past the call's deadline: renders succeed.
	r.st.lastSuccess.Store(time.Now().UnixNano())
	r.keep(&keys, prev, slices.Clone(*tp), start.UnixNano())
}

// compareTurns counts whether the previous turn's tokens prev are, but for
// at most their last token (which the next text may merge into another),
// a prefix of the new render toks.
func (r *Renderer) compareTurns(prev, toks []uint32) {
	n := 0
	for n < len(prev) && n < len(toks) && prev[n] == toks[n] {
		n++
	}
	if n+1 >= len(prev) {
		r.st.stable.Add(1)
		r.stableRun.Add(1)
		return
	}
	r.st.unstable.Add(1)
	r.stableRun.Store(0)
	r.st.diverged.Add(uint64(max(len(prev)-n, 0))) //nolint:gosec // not negative
}

// fetch asks the renderer: the render endpoint unless it is known not to
// be served (and no probe is due), else /tokenize.
func (r *Renderer) fetch(deadline time.Time, kind oai.Kind, body []byte, dst []uint32) ([]uint32, error) {
	if use, probe := r.useRender(); use {
		uri := r.chatURL
		if kind == oai.KindCompletion {
			uri = r.complURL
		}
		out, err := r.post(deadline, uri, body, "token_ids", dst)
		if !errors.Is(err, ErrRenderNotServed) {
			if err == nil {
				r.st.rendered.Add(1)
				if probe && r.tokenizeOnly.Swap(false) {
					r.log.Info("render endpoint served again", zap.String("url", uri))
				}
			}
			return out, err
		}
		r.nextProbe.Store(time.Now().Add(r.reprobe).UnixNano())
		r.st.notServed.Add(1)
		if !r.tokenizeOnly.Swap(true) {
			r.log.Warn("render endpoint not served: using /tokenize", zap.String("url", uri), zap.Error(err))
		}
	}
	bp := r.getBody()
	tb, err := r.tokenizeBody((*bp)[:0], kind, body)
	*bp = tb
	defer r.putBody(bp)
	if err != nil {
		return dst, err
	}
	out, err := r.post(deadline, r.tokenizeURL, tb, "tokens", dst)
	if err == nil {
		r.st.tokenized.Add(1)
	}
	return out, err
}

// getBody returns a request body buffer from the pool, to be put back by
// putBody.
func (r *Renderer) getBody() *[]byte {
	if bp, ok := r.bodies.Get().(*[]byte); ok {
		return bp
	}
	return new([]byte)
}

// putBody returns bp to the pool unless it grew past rdMaxPooledBody.
func (r *Renderer) putBody(bp *[]byte) {
	if cap(*bp) <= rdMaxPooledBody {
		r.bodies.Put(bp)
	}
}

// useRender reports whether a call is to try the render endpoint, and
// whether it does so as the due probe of an endpoint not served before.
func (r *Renderer) useRender() (use, probe bool) {
	if !r.tokenizeOnly.Load() {
		return true, false
	}
	now := time.Now().UnixNano()
	next := r.nextProbe.Load()
	if now < next || !r.nextProbe.CompareAndSwap(next, now+int64(r.reprobe)) {
		return false, false
	}
	r.st.probes.Add(1)
	return true, true
}

// post sends body to uri and appends the token ids of the answer's field
// to dst.
func (r *Renderer) post(deadline time.Time, uri string, body []byte, field string, dst []uint32) ([]uint32, error) {
	hreq := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(hreq)
	defer fasthttp.ReleaseResponse(resp)
	hreq.SetRequestURI(uri)
	hreq.Header.SetMethod(fasthttp.MethodPost)
	hreq.Header.SetContentType("application/json")
	hreq.SetBodyRaw(body)
	if err := r.client.DoDeadline(hreq, resp, deadline); err != nil {
		if rdIsTimeout(err) || !time.Now().Before(deadline) {
			return dst, fmt.Errorf("%w: %s: %w", ErrRenderTimeout, uri, err)
		}
		return dst, fmt.Errorf("precise: %s: %w", uri, err)
	}
	status, rb := resp.StatusCode(), resp.Body()
	if status != fasthttp.StatusOK {
		p := r.parsers.Get()
		defer r.parsers.Put(p)
		v, perr := p.ParseBytes(rb)
		isAPIError := perr == nil && (v.Exists("error") || string(v.GetStringBytes("object")) == "error")
		if (status == fasthttp.StatusNotFound || status == fasthttp.StatusMethodNotAllowed) && !isAPIError {
			return dst, fmt.Errorf("%w: %s: status %d", ErrRenderNotServed, uri, status)
		}
		return dst, fmt.Errorf("precise: %s: status %d: %.200s", uri, status, rb)
	}
	out, err := rdAppendTokens(rb, field, dst)
	if err != nil {
		return dst, fmt.Errorf("precise: %s: %w", uri, err)
	}
	return out, nil
}

// rdChatTokenizeFields are the fields of a chat request that vLLM's
// /tokenize takes and that shape the rendering; the other fields of the
// request are left out.
var rdChatTokenizeFields = []string{
	"model", "messages", "tools", "add_generation_prompt", "continue_final_message",
	"chat_template", "chat_template_kwargs", "add_special_tokens", "mm_processor_kwargs",
}

var rdCompletionTokenizeFields = []string{"model", "prompt", "add_special_tokens"}

// tokenizeBody appends to dst the /tokenize request of the request body of
// kind: its messages or prompt and the fields that shape their rendering,
// with add_generation_prompt true unless the body says otherwise (a chat
// request's default).
func (r *Renderer) tokenizeBody(dst []byte, kind oai.Kind, body []byte) ([]byte, error) {
	p := r.parsers.Get()
	defer r.parsers.Put(p)
	v, err := p.ParseBytes(body)
	if err != nil {
		return dst, fmt.Errorf("precise: tokenize: %w", err)
	}
	o, err := v.Object()
	if err != nil {
		return dst, fmt.Errorf("precise: tokenize: %w", err)
	}
	fields := rdCompletionTokenizeFields
	if kind == oai.KindChat {
		fields = rdChatTokenizeFields
	}
	dst = append(dst, '{')
	for _, f := range fields {
		fv := o.Get(f)
		if fv == nil {
			continue
		}
		if len(dst) > 1 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, f...)
		dst = append(dst, `":`...)
		if a, _ := fv.Array(); f == "prompt" && len(a) == 1 && a[0].Type() == fastjson.TypeString {
			fv = a[0] // /tokenize takes one prompt, as a string
		}
		dst = fv.MarshalTo(dst)
	}
	if kind == oai.KindChat && o.Get("add_generation_prompt") == nil {
		dst = append(dst, `,"add_generation_prompt":true`...)
	}
	return append(dst, '}'), nil
}

// rdHasData reports whether a chat request has a content part other than
// text (an image, audio, a file).
func rdHasData(req *oai.Request) bool {
	for _, m := range req.Messages {
		for _, p := range m.Parts {
			if !p.IsText {
				return true
			}
		}
	}
	return false
}

func rdIsTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) || errors.Is(err, fasthttp.ErrDialTimeout) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// Seeds of the cache's hashes, one per process.
var rdConvSeed, rdBodySeed = maphash.MakeSeed(), maphash.MakeSeed()

// rdChain folds x into the running hash h, order-sensitively.
func rdChain(h, x uint64) uint64 {
	h = (h ^ x) * 0x9e3779b97f4a7c15
	h ^= h >> 29
	h *= 0xbf58476d1ce4e5b9
	return h ^ h>>32
}

// rdKeysOf returns the cache keys of req, parsed from body.
func rdKeysOf(req *oai.Request, body []byte) rdKeys {
	k := rdKeys{body: maphash.Bytes(rdBodySeed, body)}
	if req.Kind != oai.KindChat {
		k.conv = rdChain(uint64(req.Kind), maphash.Bytes(rdConvSeed, body))
		return k
	}
	h := rdChain(uint64(req.Kind), maphash.String(rdConvSeed, req.Model))
	if req.CacheSalt != "" {
		// A salt's conversations are its own, as in the engine's cache.
		h = rdChain(h, maphash.String(rdConvSeed, req.CacheSalt)|1)
	}
	h = rdChain(h, maphash.String(rdConvSeed, req.Tools))
	n := len(req.Messages)
	for i, m := range req.Messages {
		h = rdChain(h, maphash.String(rdConvSeed, m.Raw))
		// After i+1 messages: the prefix without the last n-1-i.
		if back := n - 1 - i; back >= 1 && back <= len(k.prev) {
			k.prev[back-1] = h | 1
		}
	}
	k.conv = h | 1
	return k
}

func rdTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Stats returns a snapshot of the counters.
func (r *Renderer) Stats() RenderStats {
	s := RenderStats{
		Rendered:          r.st.rendered.Load(),
		Tokenized:         r.st.tokenized.Load(),
		CacheHits:         r.st.hits.Load(),
		Prefix:            r.st.prefix.Load(),
		Late:              r.st.late.Load(),
		VerifyFailed:      r.st.verifyFailed.Load(),
		Unverified:        r.st.unverified.Load(),
		PassThrough:       r.st.pass.Load(),
		FallbackTimeout:   r.st.fbTimeout.Load(),
		FallbackNotServed: r.st.fbNotServed.Load(),
		FallbackError:     r.st.fbError.Load(),
		FallbackUnkeyed:   r.st.fbUnkeyed.Load(),
		FallbackBehind:    r.st.fbBehind.Load(),
		RenderNotServed:   r.st.notServed.Load(),
		RenderProbes:      r.st.probes.Load(),
		Stable:            r.st.stable.Load(),
		Unstable:          r.st.unstable.Load(),
		DivergedTokens:    r.st.diverged.Load(),
		Latency:           r.st.latency.summary(),
		LastSuccess:       rdTime(r.st.lastSuccess.Load()),
		LastFallback:      rdTime(r.st.lastFallback.Load()),
		TokenizeOnly:      r.tokenizeOnly.Load(),
	}
	if r.cache != nil {
		s.CacheEntries, s.CacheBytes, s.CacheEvictions = r.cache.counts()
	}
	return s
}
