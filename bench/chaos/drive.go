package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/bench/load"
)

// Outcome is how a request ended, seen from the client.
type Outcome string

// The outcomes.
const (
	// OK: a complete response (200 JSON completion, or a stream ending
	// with finish_reason and [DONE]).
	OK Outcome = "ok"
	// Failed: a clear error (status >= 400 with an OpenAI error body, or a
	// stream ending with an SSE error event).
	Failed Outcome = "failed"
	// Lost: anything else.
	Lost Outcome = "lost"
)

// RequestResult is one request's fate.
type RequestResult struct {
	ID      string  `json:"id"`
	Stream  bool    `json:"stream"`
	Phase   int     `json:"phase"`
	Session string  `json:"session"`
	StartMs float64 `json:"start_ms"`
	EndMs   float64 `json:"end_ms"`
	Status  int     `json:"status"`
	Outcome Outcome `json:"outcome"`
	// Kind details a failure or loss: "http_502 replica_unreachable",
	// "stream_error stream_interrupted", "transport: ...", "deadline", ...
	Kind string `json:"kind,omitempty"`
	// Backend is the X-Kvroute-Backend response header.
	Backend string `json:"backend,omitempty"`
	// Attempts are what the replicas recorded for this ID (filled for
	// lost requests, violations and retried requests in the report).
	Attempts []AttemptInfo `json:"attempts,omitempty"`
}

// driver sends the chat requests.
type driver struct {
	client   *http.Client
	endpoint string
	model    string
	convs    [][]load.Request // [user][turn]
	maxTok   int
	share    float64 // share of streamed requests
	timeout  time.Duration
	t0       time.Time
}

// conversations builds users × turns multi-turn chats sharing a few system
// prompts, indexed [user][turn]; each turn's messages extend the previous
// turn's, so a replica that served turn k holds turn k+1's prefix.
func conversations(users, turns, maxTokens int, seed uint64) [][]load.Request {
	w := load.MultiTurn(load.MultiTurnOptions{
		Users: users, SystemPrompts: 4, SystemTokens: 600, Turns: turns,
		UserTokens: 60, AnswerTokens: maxTokens, Seed: seed,
	})
	idx := map[string]int{}
	convs := make([][]load.Request, 0, users)
	for _, r := range w.Requests { // turns of one user appear in order
		u, ok := idx[r.Session]
		if !ok {
			u = len(convs)
			idx[r.Session] = u
			convs = append(convs, nil)
		}
		convs[u] = append(convs[u], r)
	}
	return convs
}

// newClient returns the load's HTTP client: keep-alive, no proxy, no
// compression, no transport-level retries of POSTs.
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
	}}
}

// stream reports whether request n streams: a deterministic spread of
// share of the requests.
func (d *driver) stream(n int) bool {
	// Golden-ratio sequence: evenly spread, not periodic with the users.
	f := float64(n) * 0.6180339887498949
	return f-float64(int(f)) < d.share
}

// body returns request n's JSON body and its session.
func (d *driver) body(n int, stream bool) ([]byte, string) {
	users := len(d.convs)
	c := d.convs[n%users]
	r := c[(n/users)%len(c)]
	b := make([]byte, 0, 256+r.PromptTokens*4+len(r.Messages)*32)
	b = append(b, `{"model":`...)
	b = strconv.AppendQuote(b, d.model)
	b = append(b, `,"messages":`...)
	msgs, _ := json.Marshal(r.Messages)
	b = append(b, msgs...)
	b = append(b, `,"max_tokens":`...)
	b = strconv.AppendInt(b, int64(d.maxTok), 10)
	if stream {
		b = append(b, `,"stream":true,"stream_options":{"include_usage":true}}`...)
	} else {
		b = append(b, `,"stream":false}`...)
	}
	return b, r.Session
}

// send performs request n and classifies its outcome.
func (d *driver) send(ctx context.Context, n, phase int) (res RequestResult) {
	stream := d.stream(n)
	body, session := d.body(n, stream)
	res = RequestResult{ID: "chaos-" + strconv.Itoa(n), Stream: stream, Phase: phase, Session: session}
	rctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	start := time.Now()
	res.StartMs = ms(start.Sub(d.t0))
	defer func() { res.EndMs = ms(time.Since(d.t0)) }() // named result: seen by the caller
	lost := func(kind string) RequestResult {
		res.Outcome, res.Kind = Lost, kind
		if rctx.Err() != nil {
			res.Kind = "deadline (" + d.timeout.String() + "): " + kind
		}
		return res
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.endpoint, bytes.NewReader(body))
	if err != nil {
		return lost("request: " + err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(RequestIDHeader, res.ID)
	req.Header.Set("X-Session-ID", session)
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return lost("transport: " + err.Error())
	}
	defer func() { _ = resp.Body.Close() }()
	res.Status = resp.StatusCode
	res.Backend = resp.Header.Get("X-Kvroute-Backend")
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode >= 400:
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return lost("http_" + strconv.Itoa(resp.StatusCode) + " body read: " + err.Error())
		}
		code, ok := oaiError(b)
		if !ok {
			return lost("http_" + strconv.Itoa(resp.StatusCode) + " without an OpenAI error body: " + abbrev(b))
		}
		res.Outcome, res.Kind = Failed, "http_"+strconv.Itoa(resp.StatusCode)+" "+code
		return res
	case resp.StatusCode != http.StatusOK:
		return lost("unexpected status " + strconv.Itoa(resp.StatusCode))
	case mt == "text/event-stream":
		return d.readStream(resp.Body, res, lost)
	case mt == "application/json":
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return lost("200 body read: " + err.Error())
		}
		var v struct {
			Choices []struct {
				Message *struct {
					Content *string `json:"content"`
				} `json:"message"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &v); err != nil || len(v.Choices) == 0 || v.Choices[0].Message == nil ||
			v.Choices[0].Message.Content == nil || v.Choices[0].FinishReason == nil {
			return lost("200 JSON not a complete chat completion: " + abbrev(b))
		}
		res.Outcome = OK
		return res
	}
	return lost("200 with content type " + strconv.Quote(resp.Header.Get("Content-Type")))
}

// readStream reads an SSE chat stream to its end.
func (d *driver) readStream(body io.Reader, res RequestResult, lost func(string) RequestResult) RequestResult {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var done, finished, errEvent bool
	var errCode string
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, []byte("data:")) {
			continue
		}
		data := bytes.TrimSpace(line[5:])
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			continue
		}
		var ev struct {
			Error   json.RawMessage `json:"error"`
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(data, &ev); err != nil {
			return lost("stream event not JSON: " + abbrev(data))
		}
		if len(ev.Error) > 0 && !bytes.Equal(ev.Error, []byte("null")) {
			errEvent = true
			errCode, _ = oaiError(data)
			break
		}
		if len(ev.Choices) > 0 && ev.Choices[0].FinishReason != nil {
			finished = true
		}
	}
	switch {
	case errEvent:
		res.Outcome, res.Kind = Failed, "stream_error "+errCode
		return res
	case sc.Err() != nil:
		return lost("stream cut without an error event: " + sc.Err().Error())
	case !done:
		return lost("stream ended without [DONE] or an error event")
	case !finished:
		return lost("stream ended with [DONE] but no finish_reason")
	}
	res.Outcome = OK
	return res
}

// oaiError reports whether b is an OpenAI-style error object
// {"error":{"message":...}} and returns its code (or type).
func oaiError(b []byte) (string, bool) {
	var v struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Error == nil || v.Error.Message == "" {
		return "", false
	}
	switch c := v.Error.Code.(type) {
	case string:
		return c, true
	case float64:
		return v.Error.Type + "/" + strconv.FormatFloat(c, 'f', -1, 64), true
	}
	return v.Error.Type, true
}

func abbrev(b []byte) string {
	const maxLen = 120
	s := string(b)
	if len(s) > maxLen {
		s = s[:maxLen] + "…"
	}
	return strconv.Quote(s)
}

// run sends requests at rate until stop closes, each labelled with the
// phase current when it is sent, and returns every result once all have
// completed.
func (d *driver) run(ctx context.Context, rate float64, stop <-chan struct{}, phase func() int) []RequestResult {
	var (
		mu  sync.Mutex
		out []RequestResult
		wg  sync.WaitGroup
	)
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-stop:
			wg.Wait()
			return out
		case <-ctx.Done():
			wg.Wait()
			return out
		case <-t.C:
		}
		wg.Add(1)
		go func(n, p int) {
			defer wg.Done()
			r := d.send(ctx, n, p)
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}(n, phase())
		next = next.Add(every)
		t.Reset(max(time.Until(next), 0))
	}
}
