package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/router"
)

// A disaggregated fleet splits each chat or completions request between a
// prefill replica, which computes the prompt's KV cache, and a decode
// replica, which generates from it; the decode replica's answer is the
// client's. forward routes the decode side (router.Request.Leg decode:
// by load); before each attempt on a decode replica a pairing runs the
// prefill side (Leg prefill: by the policy, where the prefix lives), in
// the engines' own protocol:
//
//   - vLLM (a KV connector such as NIXL or Mooncake): the request goes
//     first to the prefill replica with kv_transfer_params
//     {do_remote_decode: true}, max_tokens 1 and stream false; the
//     kv_transfer_params of its answer go with the client's request to
//     the decode replica, which pulls the KV cache. A decode attempt that
//     fails is retried on another decode replica with the same
//     parameters: the prefill replica holds the blocks until pulled.
//   - SGLang (--disaggregation-mode): the same request goes to both at
//     once with bootstrap_host and bootstrap_port (the prefill replica's
//     bootstrap server) and a fresh bootstrap_room that pairs them; a
//     decode retry gets a new room and, while another is left, another
//     prefill replica (the failure may have been the prefill's, its
//     answer still on its way).
//
// A client's own kv_transfer_params and bootstrap fields are dropped: the
// router alone pairs replicas (an engine that keeps state per room a
// client chose could be made to hold it forever).

// Protocols of a disaggregated fleet (Options.Disaggregation).
const (
	ProtocolVLLM   = "vllm"
	ProtocolSGLang = "sglang"
)

// pairingFields are the request fields the router sets for the pair and
// drops when a client sends them.
var pairingFields = []string{fieldTransfer, "bootstrap_host", "bootstrap_port", "bootstrap_room"}

// fieldTransfer is vLLM's request and answer field naming the KV transfer.
const fieldTransfer = "kv_transfer_params"

// errNotObject fails a request body or answer that is not a JSON object.
var errNotObject = errors.New("not a JSON object")

// maxPrefillAnswer bounds the prefill answer kvroute reads (vLLM's is one
// token's completion and the transfer parameters; SGLang's is discarded).
const maxPrefillAnswer = 1 << 20

// pairing is the prefill side of one disaggregated request (see above).
type pairing struct {
	p        *Proxy
	ctx      *fasthttp.RequestCtx
	o        *outcome
	rreq     *router.Request // the request, routed on its decode leg
	opts     *Options
	protocol string
	kind     oai.Kind
	up       *fasthttp.Request // the forwarded request (headers)

	// failed are the prefill replicas that failed for this request; an
	// SGLang prefill reports its failure from its own goroutine, under mu.
	mu     sync.Mutex
	failed []*backends.Replica
	// paired are the SGLang prefill replicas of earlier pairs: a decode
	// failure cannot be told from its prefill's, whose answer may still
	// be on its way, so a retry pairs with another one where it can.
	paired []*backends.Replica
	body   []byte // vLLM: the decode body, with the prefill answer's kv_transfer_params
	plain  []byte // the client's body without pairing fields, for a decode replica that computes the prompt itself

	// client is the watch on the client's connection, from the first
	// prepare: the prefill requests are called off when it is gone.
	client *clientWatch

	reason  string // the prefill choice, for the route reason
	matched int    // the prompt tokens the prefill replica was believed to hold
	best    int    // the most any prefill candidate was believed to hold
	decided bool   // the first prefill decision was counted
}

// refusal is a prefill replica's answer with a 4xx status: the client's
// request is at fault, and it gets the answer as the replica gave it.
type refusal struct {
	status      int
	body        []byte
	contentType []byte
}

func (r *refusal) Error() string {
	return "prefill replica refused the request: " + strconv.Itoa(r.status)
}

// prepare runs or starts the prefill side for an attempt on the decode
// replica of dec and returns the body to send it. It fails with a
// *refusal or an *oai.Error once the prefill side cannot be had.
func (pr *pairing) prepare(dec *router.Decision) ([]byte, error) {
	pr.watch()
	if pr.client.Gone() {
		return nil, errClientLeft // no retry for a client that left
	}
	if pr.protocol == ProtocolVLLM && pr.body != nil {
		pr.note(dec)
		return pr.body, nil
	}
	var prefill []byte // vLLM's prefill request: the same on every prefill replica
	if pr.protocol == ProtocolVLLM {
		var err error
		if prefill, err = prefillBody(pr.ctx.Request.Body(), pr.kind); err != nil {
			return nil, oai.BadRequest("request body: "+err.Error(), "")
		}
	}
	var lastErr error
	for attempt := 0; attempt <= pr.opts.Retries; attempt++ {
		preq := *pr.rreq
		preq.Leg, preq.ResponseID = backends.RolePrefill, ""
		pdec, err := pr.routePrefill(&preq)
		if err != nil {
			if lastErr == nil {
				lastErr = routeError(err, pr.rreq.Model)
			}
			break
		}
		rep := pdec.Replica
		pr.o.prefill = rep.Name()
		pr.reason, pr.matched, pr.best = pdec.Reason+" prefill="+rep.Name(), pdec.Matched, pdec.Best
		pr.o.matched, pr.o.best, pr.o.exact = pdec.Matched, pdec.Best, pr.rreq.ExactTokens
		pr.decide(&pdec)
		var body []byte
		if pr.protocol == ProtocolSGLang {
			body, err = pr.startSGLang(&pdec)
		} else {
			body, err = pr.runVLLM(&pdec, prefill)
		}
		if err == nil {
			pr.note(dec)
			return body, nil
		}
		var ref *refusal
		var oe *oai.Error
		if errors.As(err, &ref) || errors.As(err, &oe) && (oe.Status == fasthttp.StatusBadRequest || oe.Status == statusClientGone) {
			return nil, err // the request's fault, or no client left: no other replica helps
		}
		lastErr = err
		pr.fail(rep)
		if attempt < pr.opts.Retries {
			pr.p.obs.Retry(rep.Name())
		}
		pr.p.log.Debug("prefill attempt failed", zap.String("replica", rep.Name()), zap.Error(err))
	}
	if lastErr == nil {
		lastErr = routeError(router.ErrNoReplica, pr.rreq.Model)
	}
	return nil, lastErr
}

// prefillFirst reports whether the prefill side runs before the decode
// replica of dec is taken: with vLLM, whose decode replica pulls the KV
// cache once the prefill answered, unless dec computes the prompt itself or
// the prefill is done already.
func (pr *pairing) prefillFirst(dec *router.Decision) bool {
	return pr.protocol == ProtocolVLLM && pr.body == nil && !dec.Local
}

// local returns the body for an attempt on the decode replica of dec,
// which computes the prompt itself (router.Decision.Local): the client's
// request without the pairing fields, as to an undisaggregated replica.
// No prefill leg runs, and the decode replica's answer tells the prompt's
// reuse.
func (pr *pairing) local(dec *router.Decision) ([]byte, error) {
	pr.watch()
	if pr.client.Gone() {
		return nil, errClientLeft
	}
	pr.o.prefill = ""
	pr.o.matched, pr.o.best, pr.o.exact = dec.Matched, dec.Best, pr.rreq.ExactTokens
	pr.decide(dec)
	if pr.plain == nil {
		body, err := editObject(pr.ctx.Request.Body(), pairingFields)
		if err != nil {
			return nil, oai.BadRequest("request body: "+err.Error(), "")
		}
		pr.plain = body
	}
	return pr.plain, nil
}

// decide counts the request's routing decision, once: its first prefill
// replica's, or the decode replica's that computes the prompt itself.
func (pr *pairing) decide(dec *router.Decision) {
	if pr.decided {
		return
	}
	pr.decided = true
	pr.p.obs.Decision(time.Since(pr.o.start), dec.Matched, pr.rreq.Tokens)
	if pr.rreq.Tokens > 0 {
		pr.p.observeBest(dec.Matched, dec.Best)
	}
}

// watch starts, once, the watch on the client's connection (clientWatch),
// until stop: once the client has closed it the prefill requests in
// flight are called off (their connections closed: the engine aborts them
// and frees their KV) and no other starts.
func (pr *pairing) watch() {
	if pr.client == nil {
		pr.client = watchClient(pr.ctx.Conn())
	}
}

// stop ends the watch before the handler returns. An SGLang prefill still
// in flight runs on: its decode has the answer's first byte, or failed.
func (pr *pairing) stop() { pr.client.Stop() }

// routePrefill routes the prefill leg away from the replicas that failed,
// and from those of earlier SGLang pairs while another one is left.
func (pr *pairing) routePrefill(req *router.Request) (router.Decision, error) {
	failed := pr.failedSoFar()
	if len(pr.paired) > 0 {
		dec, err := pr.p.router.Route(req, append(slices.Clone(failed), pr.paired...))
		if !errors.Is(err, router.ErrNoReplica) {
			return dec, err
		}
	}
	return pr.p.router.Route(req, failed)
}

// fail records that rep failed as this request's prefill replica.
func (pr *pairing) fail(rep *backends.Replica) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.failed = append(pr.failed, rep)
}

// failedSoFar returns a copy of the prefill replicas that failed so far.
func (pr *pairing) failedSoFar() []*backends.Replica {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return slices.Clone(pr.failed)
}

// note puts the prefill choice in the decode decision's reason: the
// prefill's reason and replica, then the decode's ("cache_hit
// matched=2048 prefill=p0; decode_load").
func (pr *pairing) note(dec *router.Decision) {
	dec.Reason = pr.reason + "; " + dec.Reason
	pr.o.matched, pr.o.best = pr.matched, pr.best
}

// runVLLM sends the prefill request body to the replica of dec and, from
// its answer, builds the decode body. The decision is settled either way.
func (pr *pairing) runVLLM(dec *router.Decision, body []byte) ([]byte, error) {
	rep := dec.Replica
	release := dec.Dispatched(rep.Acquire())
	defer release()
	status, answer, ctype, err := pr.p.send(pr.client.Context(), rep, pr.request(rep, body))
	dec.Started()
	if err != nil && pr.client.Gone() {
		dec.Undo() // called off: not the replica's fault
		return nil, errClientLeft
	}
	who := shownReplica(rep.Name(), pr.opts)
	// failed counts cause against the replica (none for a refusal) and
	// takes the decision back.
	failed := func(cause, err error) ([]byte, error) {
		if cause != nil {
			rep.ReportFailure(cause)
		} else {
			rep.ReportSuccess()
		}
		dec.Undo()
		return nil, err
	}
	switch {
	case err != nil:
		return failed(err, upstreamError(err, who))
	case status >= 400 && status < 500:
		return failed(nil, &refusal{status: status, body: answer, contentType: ctype})
	case status != fasthttp.StatusOK:
		return failed(statusError(status), oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_error",
			who+" (prefill) answered status "+strconv.Itoa(status)))
	}
	params, err := transferParams(answer)
	if err != nil {
		// A replica without a KV connector answers a plain completion.
		return failed(err, oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "prefill_without_transfer",
			who+" (prefill) answered without kv_transfer_params: is it running with a KV connector (--kv-transfer-config)?"))
	}
	rep.ReportSuccess()
	pr.p.observeUsage(pr.o, dec, answer)
	pr.o.usageSeen = true
	decode, err := decodeBody(pr.ctx.Request.Body(), params)
	if err != nil {
		return nil, oai.BadRequest("request body: "+err.Error(), "")
	}
	pr.body = decode
	return decode, nil
}

// startSGLang starts the prefill request on the replica of dec, with a new
// bootstrap room, and returns the same body for the decode replica. The
// prefill answer is read and dropped in the background, and the decision
// settled then.
func (pr *pairing) startSGLang(dec *router.Decision) ([]byte, error) {
	rep := dec.Replica
	host, port := rep.Bootstrap()
	body, err := bootstrapBody(pr.ctx.Request.Body(), host, port, newRoom())
	if err != nil {
		dec.Undo()
		return nil, oai.BadRequest("request body: "+err.Error(), "")
	}
	req := pr.request(rep, body)
	pr.paired = append(pr.paired, rep)
	release := dec.Dispatched(rep.Acquire())
	d := *dec
	go func() {
		defer release()
		status, answer, _, err := pr.p.send(pr.client.Context(), rep, req)
		d.Started()
		switch {
		case err != nil && pr.client.Gone():
			d.Undo() // called off: not the replica's fault
		case err != nil:
			rep.ReportFailure(err)
			d.Undo()
			pr.fail(rep) // the decode replica fails too: its retry pairs elsewhere
		case status >= 500:
			rep.ReportFailure(statusError(status))
			d.Undo()
			pr.fail(rep)
		default:
			rep.ReportSuccess()
			if prompt, cached, ok := scanUsage(answer); ok {
				pr.p.obs.Cached(d.Matched, cached, prompt, d.Precise)
				pr.p.observeReuse(nil, rep.Name(), prompt, cached, d.Matched, d.Best)
				d.Feedback(prompt, cached)
			}
		}
		if err != nil || status >= 400 {
			pr.p.log.Debug("prefill side failed", zap.String("replica", rep.Name()), zap.Int("status", status), zap.Error(err))
		}
	}()
	pr.o.usageSeen = true
	return body, nil
}

// request is the forwarded request's headers with body, pointed at rep,
// for send.
func (pr *pairing) request(rep *backends.Replica, body []byte) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	pr.up.Header.CopyTo(&req.Header)
	req.SetBodyRaw(body)
	rep.SetRequestURI(req, pr.ctx.Request.Header.RequestURI())
	return req
}

// errPrefillAnswerTooLarge fails a prefill answer past maxPrefillAnswer.
var errPrefillAnswerTooLarge = errors.New("prefill answer larger than " + strconv.Itoa(maxPrefillAnswer) + " bytes")

// send sends req to rep, releases req, and reads the answer whole, up to
// maxPrefillAnswer bytes (a larger one fails and its connection is
// closed): the answer's status, body and content type. Once ctx is done
// the request is called off (backends.Replica.Exchange).
func (p *Proxy) send(ctx context.Context, rep *backends.Replica, req *fasthttp.Request) (status int, body, ctype []byte, err error) {
	defer fasthttp.ReleaseRequest(req)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	if err := rep.Exchange(ctx, req, resp, maxPrefillAnswer); err != nil {
		if errors.Is(err, fasthttp.ErrBodyTooLarge) {
			err = errPrefillAnswerTooLarge
		}
		return 0, nil, nil, err
	}
	status = resp.StatusCode()
	ctype = append([]byte(nil), resp.Header.ContentType()...)
	return status, append([]byte(nil), resp.Body()...), ctype, nil
}

// decodeError is the client's error for a non-streamed decode that
// Exchange could not finish for a reason no other replica changes: the
// client left (the decode was called off; nothing counts against the
// replica), or the answer was larger than opts.MaxBufferedResponseBytes
// (the replica did its work; kvroute cannot hold it). Else nil, and err
// is handled as any replica's.
func (pr *pairing) decodeError(err error) *oai.Error {
	switch {
	case err == nil:
		return nil
	case pr.client.Gone():
		return errClientLeft
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return oai.NewError(fasthttp.StatusBadGateway, "upstream_error", "replica_answer_too_large",
			"the answer is larger than limits.max_buffered_response_bytes ("+
				strconv.Itoa(pr.opts.MaxBufferedResponseBytes)+" bytes), the most kvroute holds of a disaggregated answer that is not streamed; ask for a stream")
	}
	return nil
}

// newRoom returns a fresh bootstrap room: a random 63-bit integer.
func newRoom() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// editObject rebuilds body, which must be one JSON object, without its
// members named in drop or in set (every copy: a JSON object may repeat a
// key, and engines take the last), then with set's members (name and raw
// JSON value) appended in order. The members kept are copied byte for
// byte; encoding/json checks the whole body as it goes.
func editObject(body []byte, drop []string, set ...member) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errNotObject
	}
	out := make([]byte, 0, len(body)+256)
	out = append(out, '{')
	prev := dec.InputOffset()
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string) // a key is always a string
		rawKey := bytes.TrimLeft(body[prev:dec.InputOffset()], ", \t\r\n")
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		prev = dec.InputOffset()
		if slices.Contains(drop, key) || slices.ContainsFunc(set, func(m member) bool { return m.name == key }) {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, rawKey...)
		out = append(out, ':')
		out = append(out, value...)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON object")
	}
	for _, m := range set {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, m.name) // names are ASCII identifiers
		out = append(out, ':')
		out = append(out, m.value...)
	}
	return append(out, '}'), nil
}

// member is a JSON object member editObject sets: its name and raw value.
type member struct {
	name  string
	value []byte
}

// prefillParams are the kv_transfer_params of a vLLM prefill request: keep
// the KV cache for a decode elsewhere.
var prefillParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// prefillBody is the vLLM prefill request for body: one token, not
// streamed, asking the engine to keep the KV cache for a remote decode.
func prefillBody(body []byte, kind oai.Kind) ([]byte, error) {
	one := []byte("1")
	set := []member{{fieldTransfer, prefillParams}, {"max_tokens", one}}
	if kind == oai.KindChat {
		set = append(set, member{"max_completion_tokens", one})
	}
	set = append(set, member{"stream", []byte("false")})
	return editObject(body, append([]string{"stream_options"}, pairingFields...), set...)
}

// transferParams returns the kv_transfer_params object of a vLLM prefill
// answer, as JSON.
func transferParams(answer []byte) ([]byte, error) {
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, err
	}
	if len(a.Params) == 0 || a.Params[0] != '{' {
		return nil, errors.New("no kv_transfer_params object in the prefill answer")
	}
	return a.Params, nil
}

// decodeBody is the vLLM decode request: the client's body with the
// prefill answer's kv_transfer_params.
func decodeBody(body, params []byte) ([]byte, error) {
	return editObject(body, pairingFields, member{fieldTransfer, params})
}

// bootstrapBody is the SGLang request for both replicas: the client's body
// with the prefill replica's bootstrap server and the pair's room.
func bootstrapBody(body []byte, host string, port int, room uint64) ([]byte, error) {
	h, err := json.Marshal(host)
	if err != nil {
		return nil, err
	}
	return editObject(body, pairingFields,
		member{"bootstrap_host", h},
		member{"bootstrap_port", strconv.AppendInt(nil, int64(port), 10)},
		member{"bootstrap_room", strconv.AppendUint(nil, room, 10)})
}

// answered tells the pairing that the decode replica of dec answered with
// a status below 400: with vLLM it pulled the prompt's KV first, which the
// router then counts it as holding (Router.Received). A replica that
// computed the prompt itself (dec.Local) was counted when it was chosen.
func (pr *pairing) answered(dec *router.Decision) {
	if pr.protocol == ProtocolVLLM && !dec.Local {
		pr.p.router.Received(pr.rreq, dec.Replica)
	}
}

// refused reports whether err is a prefill replica's refusal and if so
// gives the client that answer, as the replica wrote it.
func (pr *pairing) refused(err error) bool {
	var ref *refusal
	if !errors.As(err, &ref) {
		return false
	}
	ctx := pr.ctx
	ctx.Response.Reset()
	ctx.SetStatusCode(ref.status)
	if len(ref.contentType) > 0 {
		ctx.Response.Header.SetContentTypeBytes(ref.contentType)
	}
	ctx.SetBody(ref.body)
	if !pr.opts.HideBackendNames {
		ctx.Response.Header.Set(headerBackend, pr.o.prefill)
	}
	pr.o.status, pr.o.replica = ref.status, pr.o.prefill
	pr.p.finish(pr.o)
	return true
}
