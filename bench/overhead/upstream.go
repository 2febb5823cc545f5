package overhead

import (
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Model is the model every upstream serves and every request names.
const Model = "overhead-model"

// chatResponse is the upstreams' answer to a non-streaming request: a
// small, complete OpenAI chat completion.
var chatResponse = []byte(`{"id":"chatcmpl-overhead","object":"chat.completion","created":1700000000,"model":"` + Model +
	`","choices":[{"index":0,"message":{"role":"assistant","content":"Sure. Here is a short answer from a fast upstream."},"finish_reason":"stop"}],` +
	`"usage":{"prompt_tokens":16,"completion_tokens":12,"total_tokens":28}}`)

var modelsResponse = []byte(`{"object":"list","data":[{"id":"` + Model + `","object":"model","created":1700000000,"owned_by":"overhead"}]}`)

// metricsResponse is a minimal vLLM /metrics: an idle engine with an empty
// KV cache of 8192 blocks of 16 tokens.
var metricsResponse = []byte(`# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",model_name="` + Model + `",num_gpu_blocks="8192"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="` + Model + `"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="` + Model + `"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="` + Model + `"} 0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="` + Model + `"} 0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="` + Model + `"} 0
`)

var (
	streamMarker = []byte(`"stream":true`)
	eventHead    = []byte(`data: {"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1700000000,"model":"` + Model + `","choices":[{"index":0,"delta":{"content":" token"},"finish_reason":null}],"t":`)
	eventLast    = []byte(`data: {"id":"chatcmpl-overhead","object":"chat.completion.chunk","created":1700000000,"model":"` + Model + `","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"t":`)
	eventDone    = []byte("data: [DONE]\n\n")
	// gapField, followed by microseconds, in a streamed request's body
	// sets the pause between its events (the upstreams' own otherwise).
	gapField = []byte(`"overhead_gap_us":`)
)

// upstreams are fast OpenAI-compatible servers that look like idle vLLM
// replicas: they answer at once, or stream events a fixed gap apart.
type upstreams struct {
	servers  []*fasthttp.Server
	addrs    []string // host:port
	events   int
	gap      time.Duration
	requests atomic.Int64 // chat completions served
}

// startUpstreams serves n upstreams on 127.0.0.1.
func startUpstreams(n, events int, gap time.Duration) (*upstreams, error) {
	u := &upstreams{events: events, gap: gap}
	for range n {
		var lc net.ListenConfig
		ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
		if err != nil {
			u.Close()
			return nil, err
		}
		s := &fasthttp.Server{
			Handler:               u.handle,
			Name:                  "overhead-upstream",
			NoDefaultDate:         true,
			NoDefaultContentType:  true,
			MaxRequestBodySize:    64 << 20,
			ReadTimeout:           time.Minute,
			IdleTimeout:           time.Minute,
			CloseOnShutdown:       true,
			NoDefaultServerHeader: true,
		}
		go func() { _ = s.Serve(ln) }()
		u.servers = append(u.servers, s)
		u.addrs = append(u.addrs, ln.Addr().String())
	}
	return u, nil
}

// URLs returns the upstreams' base URLs.
func (u *upstreams) URLs() []string {
	urls := make([]string, len(u.addrs))
	for i, a := range u.addrs {
		urls[i] = "http://" + a
	}
	return urls
}

// Close stops the upstreams.
func (u *upstreams) Close() {
	for _, s := range u.servers {
		_ = s.Shutdown()
	}
}

func (u *upstreams) handle(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/v1/chat/completions", "/v1/completions":
		if !ctx.IsPost() {
			ctx.SetStatusCode(fasthttp.StatusMethodNotAllowed)
			return
		}
		u.requests.Add(1)
		if bytes.Contains(ctx.PostBody(), streamMarker) {
			u.stream(ctx)
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBody(chatResponse)
	case "/health":
		ctx.SetStatusCode(fasthttp.StatusOK)
	case "/v1/models":
		ctx.SetContentType("application/json")
		ctx.SetBody(modelsResponse)
	case "/metrics":
		ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
		ctx.SetBody(metricsResponse)
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	}
}

// stream answers with u.events chat-completion chunks u.gap apart (or
// the gap its body asks for, bodyGap), each stamped with the unix
// nanoseconds at which it was written, then [DONE]. As an engine's server
// does, it sends the response head at once, on its own, and the first
// event one gap later (an engine's first event waits for the prompt's
// prefill): a router reads the head before the events come, and every
// event, the first included, is relayed as an event, not with the head.
func (u *upstreams) stream(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.ImmediateHeaderFlush = true
	es := newEventStream(u.events, u.gap)
	if g, ok := bodyGap(ctx.PostBody()); ok {
		es.gap = g
	}
	ctx.SetBodyStream(es, -1)
}

// eventRoom is the most bytes one event takes in eventStream.buf: its
// head (the last one's followed by [DONE]), a stamp of up to 19 digits
// and its end.
var eventRoom = max(len(eventHead), len(eventLast)+len(eventDone)) + 19 + len("}\n\n")

// newEventStream returns the body of n events gap apart. Its buffer is
// allocated here, before the head is sent, so that no event allocates
// between its stamp and its write: the first event's, growing an empty
// buffer, stalled the load generator for up to 13 ms at that event's
// p99 in a run of 1,000 streams, counted as the router's delay.
func newEventStream(n int, gap time.Duration) *eventStream {
	return &eventStream{n: n, gap: gap, buf: make([]byte, 0, eventRoom)}
}

// eventStream is a streamed answer's body. fasthttp's server calls its
// WriteTo in the connection's own goroutine and sends every Write as one
// chunk, flushed at once: unlike SetBodyStreamWriter, no goroutine and
// pipe per stream, so a thousand streams cost the load generator's core
// one write per event.
type eventStream struct {
	n, i  int
	gap   time.Duration
	start time.Time // when the head was sent
	buf   []byte
}

// wait sleeps until event es.i is due: es.i+1 gaps after the head, on a
// fixed timeline, so a late wake-up (the load generator's core busy) does
// not delay the stream's later events; otherwise streams woken late
// together would stay in step and their events come in ever larger bursts.
// fasthttp has sent the head (ImmediateHeaderFlush) by the first call.
func (es *eventStream) wait() {
	if es.i == 0 {
		es.start = time.Now()
	}
	if es.gap > 0 {
		time.Sleep(time.Until(es.start.Add(time.Duration(es.i+1) * es.gap)))
	}
}

// next appends event i to es.buf and advances.
func (es *eventStream) next() []byte {
	head := eventHead
	last := es.i == es.n-1
	if last {
		head = eventLast
	}
	b := append(es.buf[:0], head...)
	b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
	b = append(b, "}\n\n"...)
	if last {
		b = append(b, eventDone...)
	}
	es.buf = b
	es.i++
	return b
}

// Read is for fasthttp's readers that do not use WriteTo: one event per
// call, when it is due (wait).
func (es *eventStream) Read(p []byte) (int, error) {
	if es.i >= es.n {
		return 0, io.EOF
	}
	es.wait()
	b := es.next()
	if len(p) < len(b) {
		return 0, io.ErrShortBuffer
	}
	return copy(p, b), nil
}

// SupportsBodyWriteTo tells fasthttp to use WriteTo.
func (es *eventStream) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the events to w, one Write each, es.gap apart (wait).
func (es *eventStream) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for es.i < es.n {
		es.wait()
		n, err := w.Write(es.next())
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// bodyGap returns the pause between events body asks for (gapField).
func bodyGap(body []byte) (time.Duration, bool) {
	i := bytes.Index(body, gapField)
	if i < 0 {
		return 0, false
	}
	var us int64
	n := 0
	for _, c := range body[i+len(gapField):] {
		if c < '0' || c > '9' || n == 12 {
			break
		}
		us = us*10 + int64(c-'0')
		n++
	}
	return time.Duration(us) * time.Microsecond, n > 0
}
