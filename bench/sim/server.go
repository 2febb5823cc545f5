package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 64 << 20

// Handler returns the replica's net/http handler: POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health, GET /metrics, and
// vLLM's POST /v1/chat/completions/render, /v1/completions/render,
// /tokenize and /reset_prefix_cache (see render.go).
func (r *Replica) Handler() http.Handler { return r.handler }

func (r *Replica) newMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, req *http.Request) {
		r.serveGenerate(w, req, true)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, req *http.Request) {
		r.serveGenerate(w, req, false)
	})
	mux.HandleFunc("GET /v1/models", r.serveModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /metrics", r.serveMetrics)
	mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, req *http.Request) {
		r.serveRender(w, req, true)
	})
	mux.HandleFunc("POST /v1/completions/render", func(w http.ResponseWriter, req *http.Request) {
		r.serveRender(w, req, false)
	})
	mux.HandleFunc("POST /tokenize", r.serveTokenize)
	mux.HandleFunc("POST /reset_prefix_cache", r.serveResetPrefixCache)
	return mux
}

// apiRequest holds the fields of a chat or completions request the sim
// reads; everything else is ignored.
type apiRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	Prompt              json.RawMessage `json:"prompt"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MinTokens           int             `json:"min_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	Seed                *int64          `json:"seed"`
	// Disaggregation (see Config.Role): vLLM's transfer parameters and
	// SGLang's bootstrap room.
	KVTransfer    *kvTransfer `json:"kv_transfer_params"`
	BootstrapRoom *uint64     `json:"bootstrap_room"`
}

// kvTransfer is vLLM's kv_transfer_params of a request.
type kvTransfer struct {
	DoRemoteDecode  bool `json:"do_remote_decode"`
	DoRemotePrefill bool `json:"do_remote_prefill"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// writeError writes an OpenAI error body.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg,
		"type":    "invalid_request_error",
		"param":   nil,
		"code":    code,
	}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (r *Replica) reject(w http.ResponseWriter, status int, code, msg string) {
	r.mu.Lock()
	r.c.rejected++
	r.mu.Unlock()
	writeError(w, status, code, msg)
}

func (r *Replica) serveModels(w http.ResponseWriter, _ *http.Request) {
	body, _ := json.Marshal(map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id":            r.cfg.Model,
			"object":        "model",
			"created":       0,
			"owned_by":      "vllm",
			"root":          r.cfg.Model,
			"max_model_len": r.cfg.MaxModelLen,
		}},
	})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// apiError is a request's OpenAI-style error.
type apiError struct {
	status    int
	code, msg string
}

func badRequest(code, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, msg: msg}
}

// readBody reads a request body, bounded by maxBodyBytes.
func readBody(w http.ResponseWriter, hr *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, "request_too_large", "request body too large"}
		}
		return nil, badRequest("invalid_body", "reading request body: "+err.Error())
	}
	return body, nil
}

// decodeRequest decodes a JSON body into in, whose model is *model, and
// checks the model (none named means the replica's).
func (r *Replica) decodeRequest(body []byte, in any, model *string) *apiError {
	if err := json.Unmarshal(body, in); err != nil {
		return badRequest("invalid_json", "invalid JSON body: "+err.Error())
	}
	if *model != "" && *model != r.cfg.Model {
		return &apiError{http.StatusNotFound, "model_not_found", fmt.Sprintf("The model `%s` does not exist.", *model)}
	}
	return nil
}

// renderInput renders a chat request's messages (and tools) or a
// completions request's prompt into the bytes the replica tokenizes.
func renderInput(chat bool, tools json.RawMessage, msgs []chatMessage, prompt json.RawMessage) ([]byte, *apiError) {
	var out []byte
	var err error
	if chat {
		if len(msgs) == 0 {
			return nil, badRequest("invalid_value", "messages must be a non-empty array")
		}
		out, err = renderChat(tools, msgs)
	} else {
		out, err = renderPrompt(prompt)
	}
	if err != nil {
		return nil, badRequest("invalid_value", err.Error())
	}
	if len(out) == 0 {
		return nil, badRequest("invalid_value", "the prompt is empty")
	}
	return out, nil
}

// parsed is a chat or completions request as the engine takes it.
type parsed struct {
	in        apiRequest
	prompt    []byte
	tokens    int // prompt tokens
	maxTokens int
}

// parseGenerate reads a chat or completions request and checks it against
// the replica's limits; a render of the request checks it the same way.
func (r *Replica) parseGenerate(w http.ResponseWriter, hr *http.Request, chat bool) (*parsed, *apiError) {
	body, e := readBody(w, hr)
	if e != nil {
		return nil, e
	}
	p := &parsed{}
	in := &p.in
	if e := r.decodeRequest(body, in, &in.Model); e != nil {
		return nil, e
	}
	if p.prompt, e = renderInput(chat, in.Tools, in.Messages, in.Prompt); e != nil {
		return nil, e
	}
	P := numTokens(len(p.prompt))
	p.tokens = P
	maxTokens := min(r.cfg.DefaultMaxTokens, r.cfg.MaxModelLen-P)
	switch {
	case in.MaxCompletionTokens != nil:
		maxTokens = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
		maxTokens = *in.MaxTokens
	}
	if maxTokens < 1 {
		return nil, badRequest("invalid_value", fmt.Sprintf("max_tokens must be at least 1, got %d.", maxTokens))
	}
	if P+maxTokens > r.cfg.MaxModelLen {
		return nil, badRequest("context_length_exceeded", fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			r.cfg.MaxModelLen, P+maxTokens, P, maxTokens))
	}
	bs := r.cfg.BlockSize
	if (P+maxTokens+bs-1)/bs > r.cfg.NumGPUBlocks {
		return nil, badRequest("context_length_exceeded", fmt.Sprintf(
			"request needs %d tokens of KV cache but the replica holds %d.",
			P+maxTokens, r.cfg.NumGPUBlocks*bs))
	}
	p.maxTokens = maxTokens
	return p, nil
}

// serveGenerate handles chat and completions requests.
func (r *Replica) serveGenerate(w http.ResponseWriter, hr *http.Request, chat bool) {
	p, e := r.parseGenerate(w, hr, chat)
	if e != nil {
		r.reject(w, e.status, e.code, e.msg)
		return
	}
	in, prompt, P, maxTokens := &p.in, p.prompt, p.tokens, p.maxTokens
	bs := r.cfg.BlockSize
	seed := promptSeed(prompt, in.Seed)
	keys := blockKeys(prompt, bs)
	q := &request{
		promptTokens: P,
		keys:         keys,
		tail:         bytes.Clone(prompt[len(keys)*bs*BytesPerToken:]),
		chat:         chat,
		maxTokens:    maxTokens,
		target:       stopAfter(seed, maxTokens, in.MinTokens, in.IgnoreEOS),
		seed:         seed,
		notify:       make(chan struct{}, 1),
	}
	if r.events != nil {
		q.prompt = prompt
	}
	handoff, room := r.pairing(hr.Context(), in, q)
	if room != nil {
		defer room.finish()
	}
	r.submit(q)
	defer r.abort(q) // no-op once finished

	n := r.ids.Add(1)
	o := &output{
		chat:    chat,
		created: time.Now().Unix(),
		q:       q,
	}
	if chat {
		o.id = "chatcmpl-" + r.cfg.Name + "-" + strconv.FormatUint(n, 10)
	} else {
		o.id = "cmpl-" + r.cfg.Name + "-" + strconv.FormatUint(n, 10)
	}
	o.model, _ = json.Marshal(r.cfg.Model)
	o.idJSON, _ = json.Marshal(o.id)
	if handoff {
		o.transfer = transferParams(r.cfg.Name, len(keys))
	}
	if in.Stream {
		o.usage = in.StreamOptions != nil && in.StreamOptions.IncludeUsage
		r.stream(hr.Context(), w, o)
		return
	}
	r.respond(hr.Context(), w, o)
}

// output renders one request's response.
type output struct {
	transfer []byte // vLLM's kv_transfer_params of a prefill answer, or nil
	chat     bool
	usage    bool // stream_options.include_usage
	id       string
	idJSON   []byte
	model    []byte // JSON string
	created  int64
	q        *request
}

// progress reads a request's engine state.
func (r *Replica) progress(q *request) (generated int, done bool, cached int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return q.generated, q.state == stateDone, max(q.cached, 0)
}

// respond waits for the request to finish and writes one JSON response.
func (r *Replica) respond(ctx context.Context, w http.ResponseWriter, o *output) {
	q := o.q
	for {
		select {
		case <-q.notify:
		case <-ctx.Done():
			return
		}
		gen, done, cached := r.progress(q)
		if !done {
			continue
		}
		text := appendAnswer(make([]byte, 0, gen*BytesPerToken), q.seed, gen)
		choice := map[string]any{
			"index":         0,
			"logprobs":      nil,
			"finish_reason": finishReason(q),
		}
		object := "text_completion"
		if o.chat {
			object = "chat.completion"
			choice["message"] = map[string]any{"role": "assistant", "content": string(text)}
		} else {
			choice["text"] = string(text)
			choice["stop_reason"] = nil
		}
		body, _ := json.Marshal(map[string]any{
			"id":      o.id,
			"object":  object,
			"created": o.created,
			"model":   json.RawMessage(o.model),
			"choices": []any{choice},
			"usage":   json.RawMessage(usageJSON(nil, q.promptTokens, gen, cached)),
		})
		if o.transfer != nil {
			body = append(body[:len(body)-1], `,"kv_transfer_params":`...)
			body = append(append(body, o.transfer...), '}')
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	}
}

func finishReason(q *request) string {
	if q.target < q.maxTokens {
		return "stop"
	}
	return "length"
}

func usageJSON(b []byte, prompt, completion, cached int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(prompt+completion), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(completion), 10)
	b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
	b = strconv.AppendInt(b, int64(cached), 10)
	return append(b, `}}`...)
}

// stream writes SSE events as the engine produces tokens: one event per
// token (the first carries the assistant role for chat), the last token's
// event carries finish_reason, then the usage event if asked, then [DONE].
// Tokens produced between two wake-ups are written with one socket write.
func (r *Replica) stream(ctx context.Context, w http.ResponseWriter, o *output) {
	q := o.q
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	var (
		buf       []byte
		sent      int
		lastWrite time.Time
		ivl       = r.cfg.StreamFlushInterval
		tick      *time.Timer
	)
	for {
		select {
		case <-q.notify:
		case <-ctx.Done():
			return
		}
		if ivl > 0 && sent > 0 {
			if d := time.Until(lastWrite.Add(ivl)); d > 0 {
				if tick == nil {
					tick = time.NewTimer(d)
				} else {
					tick.Reset(d)
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					tick.Stop()
					return
				}
			}
		}
		gen, done, cached := r.progress(q)
		buf = buf[:0]
		for ; sent < gen; sent++ {
			last := done && sent == gen-1
			if o.chat && sent == 0 {
				buf = o.chunk(buf, "", true, false)
			}
			buf = o.chunk(buf, tokenText(q.seed, sent), false, last)
		}
		if done {
			if o.usage {
				buf = append(buf, `data: {"id":`...)
				buf = append(buf, o.idJSON...)
				if o.chat {
					buf = append(buf, `,"object":"chat.completion.chunk","created":`...)
				} else {
					buf = append(buf, `,"object":"text_completion","created":`...)
				}
				buf = strconv.AppendInt(buf, o.created, 10)
				buf = append(buf, `,"model":`...)
				buf = append(buf, o.model...)
				buf = append(buf, `,"choices":[],"usage":`...)
				buf = usageJSON(buf, q.promptTokens, gen, cached)
				buf = append(buf, "}\n\n"...)
			}
			buf = append(buf, "data: [DONE]\n\n"...)
		}
		if len(buf) == 0 {
			continue
		}
		if _, err := w.Write(buf); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
		lastWrite = time.Now()
		if done {
			return
		}
	}
}

// chunk appends one SSE event carrying token text tok (role marks the
// chat role-only first event; last sets finish_reason).
func (o *output) chunk(b []byte, tok string, role, last bool) []byte {
	b = append(b, `data: {"id":`...)
	b = append(b, o.idJSON...)
	if o.chat {
		b = append(b, `,"object":"chat.completion.chunk","created":`...)
	} else {
		b = append(b, `,"object":"text_completion","created":`...)
	}
	b = strconv.AppendInt(b, o.created, 10)
	b = append(b, `,"model":`...)
	b = append(b, o.model...)
	if o.chat {
		if role {
			b = append(b, `,"choices":[{"index":0,"delta":{"role":"assistant","content":""}`...)
		} else {
			b = append(b, `,"choices":[{"index":0,"delta":{"content":"`...)
			b = append(b, tok...) // vocabulary words need no escaping
			b = append(b, `"}`...)
		}
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `,"choices":[{"index":0,"text":"`...)
		b = append(b, tok...)
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if last {
		b = append(b, '"')
		b = append(b, finishReason(o.q)...)
		b = append(b, '"')
	} else {
		b = append(b, "null"...)
	}
	if !o.chat {
		b = append(b, `,"stop_reason":null`...)
	}
	b = append(b, "}]"...)
	if o.usage {
		b = append(b, `,"usage":null`...)
	}
	return append(b, "}\n\n"...)
}
