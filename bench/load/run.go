package load

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// RunOptions configures Run.
type RunOptions struct {
	// Model is the "model" field of every request; empty omits it.
	Model string
	// Timeout bounds each request (from sending to the end of its stream);
	// 0 means none. A request that runs out of time has ErrKind "timeout".
	Timeout time.Duration
	// Concurrency caps the requests in flight; 0 means unbounded (pure open
	// loop). Requests over the cap wait, and their Lag shows it.
	Concurrency int
	// OnDone, when set, is called after each sent request completes, with
	// its index in the workload and its sample. It is called from many
	// goroutines at once and must be safe for concurrent use.
	OnDone func(index int, s Sample)
	// SessionHeader is the header carrying Request.Session (default
	// X-Session-ID).
	SessionHeader string
	// TenantHeader is the header carrying Request.Tenant (default
	// DefaultTenantHeader).
	TenantHeader string
	// Header holds extra request headers (for example Authorization).
	Header http.Header
	// Client is the HTTP client; nil uses one tuned for hundreds of
	// concurrent streams to one host (NewClient).
	Client *http.Client
	// KeepSent keeps the messages each request was sent with in
	// Result.Sent (a later turn's carry the answers its conversation
	// received).
	KeepSent bool
}

// DefaultTenantHeader is the header Run sends Request.Tenant in unless
// RunOptions.TenantHeader names another: what kvroute reads the tenant from
// with flow.tenant "header:X-Tenant".
const DefaultTenantHeader = "X-Tenant"

// Error kinds of Sample.ErrKind besides "http_<status>".
const (
	// ErrTransport: the request could not be sent or its response could
	// not be read (connection refused, reset, ...).
	ErrTransport = "transport"
	// ErrStream: the event stream carried an error object, or ended
	// without its final "data: [DONE]".
	ErrStream = "stream_error"
	// ErrTimeout: RunOptions.Timeout expired.
	ErrTimeout = "timeout"
	// ErrCanceled: Run's context was canceled while the request was in
	// flight.
	ErrCanceled = "canceled"
	// ErrNotSent: Run's context was canceled before the request was sent.
	ErrNotSent = "not_sent"
)

// Sample is the measurement of one request. Durations are measured (not
// unscaled).
type Sample struct {
	// TTFT is the time from sending the request to the first event
	// carrying content (choices[0].delta.content, or text for completions).
	// It equals Latency for a successful response without content.
	TTFT time.Duration
	// Latency is the time from sending the request to the end of its
	// response ("data: [DONE]"), or to the error.
	Latency time.Duration
	// OutputTokens is usage.completion_tokens when the server reported
	// usage, else the number of content events.
	OutputTokens int
	// PromptTokens is usage.prompt_tokens when reported, else
	// Request.PromptTokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens when
	// reported (see CachedReported).
	CachedTokens int
	// Status is the HTTP status code; 0 when none was received.
	Status int
	// ErrKind is empty for a success, else "http_<status>" or one of the
	// Err* constants.
	ErrKind string
	// Replica is the X-Kvroute-Backend response header.
	Replica string
	// Route is the X-Kvroute-Route response header.
	Route string
	// Tenant is the request's Request.Tenant, set whether or not it was
	// sent.
	Tenant string
	// Start is when the request was sent, from the start of the run.
	Start time.Duration
	// Lag is how much later than due the request was sent: due is At, or
	// for a dependent turn max(At, dependency's end + Think). A large Lag
	// means the generator (or the Concurrency cap) could not keep up.
	Lag time.Duration
	// Sent reports whether the request was sent at all.
	Sent bool
	// UsageReported reports whether the response carried usage.
	UsageReported bool
	// CachedReported reports whether usage carried cached_tokens.
	CachedReported bool
}

// OK reports whether the request succeeded.
func (s *Sample) OK() bool { return s.Sent && s.Status == http.StatusOK && s.ErrKind == "" }

// Result holds the samples of a run, indexed like Workload.Requests.
type Result struct {
	// Samples, one per request of the workload, in the same order.
	Samples []Sample
	// Wall is the time from the start of the run to the end of the last
	// request.
	Wall time.Duration
	// Sent, with RunOptions.KeepSent, holds the messages each request was
	// sent with (nil for one not sent), indexed like Samples.
	Sent [][]Message
}

// NewClient returns an HTTP/1.1 client for load generation: no proxy from
// the environment, no compression, and up to maxConns kept-alive
// connections per host (each stream holds one connection).
func NewClient(maxConns int) *http.Client {
	if maxConns <= 0 {
		maxConns = 4096
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       32 << 10,
		ReadBufferSize:        8 << 10,
		ExpectContinueTimeout: 0,
	}}
}

// Run replays w against the OpenAI-compatible server at base URL target
// (POST target/v1/chat/completions), open loop: every request is sent at
// its arrival offset however many are still in flight, except that a
// request with DependsOn >= 0 is sent at max(At, end of DependsOn + Think).
// A request with SendsAnswer is sent only once AnswerOf has completed too,
// and carries the answers its conversation received (see
// Request.SendsAnswer). Each request streams (with usage) and sets
// ignore_eos. Run returns when
// every request has completed; if ctx is canceled it stops sending, cancels
// the requests in flight and returns the partial result with ctx's error.
func Run(ctx context.Context, target string, w *Workload, opt RunOptions) (*Result, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("load: bad target %q", target)
	}
	endpoint := strings.TrimRight(target, "/") + "/v1/chat/completions"
	reqs := w.Requests
	n := len(reqs)
	var done []chan struct{}
	for i := range reqs {
		d := reqs[i].DependsOn
		if d < 0 {
			continue
		}
		if d >= i {
			return nil, fmt.Errorf("load: request %d depends on %d, not an earlier request", i, d)
		}
		if done == nil {
			done = make([]chan struct{}, n)
		}
		if done[d] == nil {
			done[d] = make(chan struct{})
		}
	}
	// keep marks the requests whose messages and answer a later request
	// sends back; sent and answers hold them, written before done[i] is
	// closed.
	var keep []bool
	var sent [][]Message
	var answers []string
	for i := range reqs {
		if !reqs[i].SendsAnswer {
			continue
		}
		if err := checkSendsAnswer(reqs, i); err != nil {
			return nil, err
		}
		if keep == nil {
			keep, sent, answers = make([]bool, n), make([][]Message, n), make([]string, n)
		}
		a := reqs[i].AnswerOf
		keep[a] = true
		if done == nil {
			done = make([]chan struct{}, n)
		}
		if done[a] == nil {
			done[a] = make(chan struct{})
		}
	}
	client := opt.Client
	if client == nil {
		client = NewClient(0)
		defer client.CloseIdleConnections()
	}
	if opt.SessionHeader == "" {
		opt.SessionHeader = "X-Session-ID"
	}
	if opt.TenantHeader == "" {
		opt.TenantHeader = DefaultTenantHeader
	}
	var sem chan struct{}
	if opt.Concurrency > 0 {
		sem = make(chan struct{}, opt.Concurrency)
	}
	res := &Result{Samples: make([]Sample, n)}
	if opt.KeepSent {
		res.Sent = make([][]Message, n)
	}
	ends := make([]time.Duration, n) // written before close(done[i])
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		return cmp.Compare(reqs[a].At, reqs[b].At)
	})

	start := time.Now()
	// sleepUntil waits until offset due from start; false if ctx ended.
	sleepUntil := func(due time.Duration, t *time.Timer) bool {
		d := due - time.Since(start)
		if d <= 0 {
			return ctx.Err() == nil
		}
		t.Reset(d)
		select {
		case <-t.C:
			return true
		case <-ctx.Done():
			t.Stop()
			return false
		}
	}
	var wg sync.WaitGroup
	one := func(i int) {
		defer wg.Done()
		r := &reqs[i]
		s := &res.Samples[i]
		defer func() {
			if done != nil && done[i] != nil {
				close(done[i])
			}
		}()
		due := r.At
		if r.DependsOn >= 0 {
			select {
			case <-done[r.DependsOn]:
			case <-ctx.Done():
				s.ErrKind = ErrNotSent
				return
			}
			due = max(due, ends[r.DependsOn]+r.Think)
			t := time.NewTimer(time.Hour)
			ok := sleepUntil(due, t)
			t.Stop()
			if !ok {
				s.ErrKind = ErrNotSent
				return
			}
		}
		if sem != nil {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				s.ErrKind = ErrNotSent
				return
			}
		}
		msgs := r.Messages
		if r.SendsAnswer {
			a := r.AnswerOf
			select {
			case <-done[a]:
			case <-ctx.Done():
				s.ErrKind = ErrNotSent
				return
			}
			msgs = withAnswer(r, len(reqs[a].Messages), sent[a], answers[a])
		}
		kept := keep != nil && keep[i]
		if kept {
			sent[i] = msgs
		}
		if res.Sent != nil {
			res.Sent[i] = sentMessages(r, msgs)
		}
		var answer string
		*s, answer = send(ctx, client, endpoint, r, msgs, kept, &opt, start)
		if kept && s.OK() {
			answers[i] = answer
		}
		s.Lag = max(s.Start-due, 0)
		ends[i] = s.Start + s.Latency
		if opt.OnDone != nil {
			opt.OnDone(i, *s)
		}
	}

	timer := time.NewTimer(time.Hour)
	launched := 0
	for _, i := range order {
		if !sleepUntil(reqs[i].At, timer) {
			break
		}
		wg.Add(1)
		go one(i)
		launched++
	}
	timer.Stop()
	wg.Wait()
	res.Wall = time.Since(start)
	if launched < n {
		for _, i := range order[launched:] {
			res.Samples[i].ErrKind = ErrNotSent
		}
	}
	for i := range res.Samples {
		res.Samples[i].Tenant = reqs[i].Tenant
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// checkSendsAnswer checks that request i, which has SendsAnswer, extends
// the messages of the earlier request AnswerOf by an assistant message.
func checkSendsAnswer(reqs []Request, i int) error {
	r := &reqs[i]
	a := r.AnswerOf
	if a < 0 || a >= i {
		return fmt.Errorf("load: request %d sends back the answer of %d, not an earlier request", i, a)
	}
	n := len(reqs[a].Messages)
	if reqs[a].Messages == nil || len(r.Messages) <= n || r.Messages[n].Role != roleAssistant {
		return fmt.Errorf("load: request %d sends back the answer of request %d but does not extend its messages by an assistant message", i, a)
	}
	return nil
}

// withAnswer returns the messages to send for r, which has SendsAnswer:
// the messages sent for AnswerOf (depSent; r's own first n when nil, n
// being the number of AnswerOf's messages), the assistant message
// at index n with content answer (the placeholder when answer is empty),
// and r's messages after it.
func withAnswer(r *Request, n int, depSent []Message, answer string) []Message {
	out := make([]Message, 0, len(r.Messages))
	if len(depSent) == n {
		out = append(out, depSent...)
	} else {
		out = append(out, r.Messages[:n]...)
	}
	a := r.Messages[n]
	if answer != "" {
		a.Content = answer
	}
	out = append(out, a)
	return append(out, r.Messages[n+1:]...)
}

// send performs one request with messages msgs (r's own, or with the
// answers of earlier turns) and measures it. With keepAnswer it also
// returns the answer's text (the content deltas, or the message's
// content). opt's SessionHeader and TenantHeader are set.
func send(ctx context.Context, client *http.Client, endpoint string, r *Request, msgs []Message, keepAnswer bool, opt *RunOptions, runStart time.Time) (Sample, string) {
	s := Sample{Sent: true, PromptTokens: r.PromptTokens, Tenant: r.Tenant}
	body := appendChatBody(make([]byte, 0, 256+r.PromptTokens*BytesPerToken+len(msgs)*32), opt.Model, r, msgs)
	rctx := ctx
	if opt.Timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, opt.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		s.ErrKind = ErrTransport
		return s, ""
	}
	for k, vs := range opt.Header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if r.Session != "" {
		req.Header.Set(opt.SessionHeader, r.Session)
	}
	if r.Tenant != "" {
		req.Header.Set(opt.TenantHeader, r.Tenant)
	}
	t0 := time.Now()
	s.Start = t0.Sub(runStart)
	classify := func(err error) string {
		switch {
		case ctx.Err() != nil:
			return ErrCanceled
		case rctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
			return ErrTimeout
		default:
			return ErrTransport
		}
	}
	resp, err := client.Do(req)
	if err != nil {
		s.Latency = time.Since(t0)
		s.ErrKind = classify(err)
		return s, ""
	}
	defer func() { _ = resp.Body.Close() }()
	s.Status = resp.StatusCode
	s.Replica = resp.Header.Get("X-Kvroute-Backend")
	s.Route = resp.Header.Get("X-Kvroute-Route")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.Latency = time.Since(t0)
		s.ErrKind = "http_" + strconv.Itoa(resp.StatusCode)
		return s, ""
	}
	st := stream{t0: t0}
	var rd io.Reader = resp.Body
	var raw *bytes.Buffer // the response body, kept to read the answer from
	if keepAnswer {
		raw = new(bytes.Buffer)
		rd = io.TeeReader(resp.Body, raw)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	sse := mt != "application/json"
	if !sse {
		// A non-streamed answer: the whole completion at once.
		b, err := io.ReadAll(rd)
		now := time.Now()
		s.Latency = now.Sub(t0)
		if err != nil {
			s.ErrKind = classify(err)
			return s, ""
		}
		p := parserPool.Get()
		st.onJSON(p, b, now)
		parserPool.Put(p)
		st.done = st.parseErrors == 0
		st.end = s.Latency
	} else {
		err = st.readSSE(rd)
		s.Latency = time.Since(t0)
		if st.done {
			s.Latency = st.end
		}
		if err != nil && !st.done {
			s.ErrKind = classify(err)
			if s.ErrKind == ErrTransport {
				s.ErrKind = ErrStream
			}
		}
	}
	if s.ErrKind == "" && (st.errEvent || !st.done) {
		s.ErrKind = ErrStream
	}
	s.TTFT = st.ttft
	if st.events == 0 {
		s.TTFT = s.Latency
	}
	s.OutputTokens = st.events
	if st.usage {
		s.UsageReported = true
		s.OutputTokens = st.complTok
		if st.promptTok > 0 {
			s.PromptTokens = st.promptTok
		}
	}
	if st.cached {
		s.CachedReported = true
		s.CachedTokens = st.cachedTok
	}
	if raw == nil || s.ErrKind != "" {
		return s, ""
	}
	return s, answerText(raw.Bytes(), sse)
}

// answerText returns the text of the answer in a response body: the
// content of the chat message (or the completion's text) of a JSON body,
// or the concatenated content deltas (or texts) of an SSE stream's events.
func answerText(body []byte, sse bool) string {
	p := parserPool.Get()
	defer parserPool.Put(p)
	var out []byte
	add := func(data []byte) {
		v, err := p.ParseBytes(data) // "[DONE]" is not JSON: skipped
		if err != nil {
			return
		}
		if ch := v.Get("choices", "0"); ch != nil {
			out = append(out, ch.GetStringBytes("delta", "content")...)
			out = append(out, ch.GetStringBytes("message", "content")...)
			out = append(out, ch.GetStringBytes("text")...)
		}
	}
	if !sse {
		add(body)
		return string(out)
	}
	var event []byte
	for line := range bytes.Lines(body) {
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			if len(event) > 0 {
				add(event)
			}
			event = event[:0]
			continue
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if len(event) > 0 {
				event = append(event, '\n')
			}
			event = append(event, bytes.TrimPrefix(d, []byte(" "))...)
		}
	}
	if len(event) > 0 {
		add(event)
	}
	return string(out)
}

// appendBody appends the JSON body of a streaming chat completion for r.
func appendBody(dst []byte, model string, r *Request) []byte {
	return appendChatBody(dst, model, r, r.Messages)
}

// sentMessages is what appendChatBody sends for r and msgs, as messages.
func sentMessages(r *Request, msgs []Message) []Message {
	if r.Messages == nil && len(r.Blocks) > 0 {
		return []Message{{Role: roleUser, Content: string(appendMooncakePrompt(nil, r.Blocks, r.PromptTokens))}}
	}
	return msgs
}

// appendChatBody is appendBody sending messages msgs in place of r's own
// (unless r is a Mooncake request of synthesized text).
func appendChatBody(dst []byte, model string, r *Request, msgs []Message) []byte {
	dst = append(dst, '{')
	if model != "" {
		dst = append(dst, `"model":`...)
		dst = appendJSONString(dst, model)
		dst = append(dst, ',')
	}
	dst = append(dst, `"messages":[`...)
	if r.Messages == nil && len(r.Blocks) > 0 {
		// Synthetic text is letters and spaces: no escaping needed.
		dst = append(dst, `{"role":"user","content":"`...)
		dst = appendMooncakePrompt(dst, r.Blocks, r.PromptTokens)
		dst = append(dst, `"}`...)
	} else {
		for i, m := range msgs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"role":`...)
			dst = appendJSONString(dst, m.Role)
			dst = append(dst, `,"content":`...)
			dst = appendJSONString(dst, m.Content)
			dst = append(dst, '}')
		}
	}
	dst = append(dst, ']')
	if r.MaxTokens > 0 {
		dst = append(dst, `,"max_tokens":`...)
		dst = strconv.AppendInt(dst, int64(r.MaxTokens), 10)
		dst = append(dst, `,"ignore_eos":true`...)
	}
	dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}}`...)
	return dst
}
