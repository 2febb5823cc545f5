package sim

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
)

// TokenIDs returns the ids of the tokens of a rendered prompt (RenderChat
// of a conversation, or a completions prompt as sent): token i is the
// prompt's bytes [4i, 4i+4) read as a little-endian uint32, and the last
// token of a prompt whose length is not a multiple of BytesPerToken is its
// remaining 1 to 3 bytes, zero-padded. Cut in blocks of BlockSize, the ids
// of a prompt's whole blocks are exactly the bytes the replica keys its
// cache blocks by, and the ids of a block in a BlockStored event are the
// same. TokenBytes inverts it.
func TokenIDs(prompt []byte) []uint32 {
	ids := make([]uint32, numTokens(len(prompt)))
	for i := range ids {
		var b [BytesPerToken]byte
		copy(b[:], prompt[i*BytesPerToken:])
		ids[i] = binary.LittleEndian.Uint32(b[:])
	}
	return ids
}

// TokenBytes returns the bytes of token ids, BytesPerToken little-endian
// bytes each: how the replica reads a completions prompt of token ids. It
// inverts TokenIDs: TokenBytes(TokenIDs(p)) is p, zero-padded to a whole
// number of tokens.
func TokenBytes(ids []uint32) []byte {
	return appendIDs(make([]byte, 0, len(ids)*BytesPerToken), ids)
}

// renderResult is one rendered request as vLLM's render endpoints return it
// (a GenerateRequest): the prompt's token ids and the sampling parameters a
// generate call would use.
type renderResult struct {
	RequestID string   `json:"request_id"`
	TokenIDs  []uint32 `json:"token_ids"`
	renderRest
}

// renderRest is what follows a renderResult's token ids.
type renderRest struct {
	Features         any            `json:"features"`
	SamplingParams   samplingParams `json:"sampling_params"`
	Model            string         `json:"model"`
	Stream           bool           `json:"stream"`
	StreamOptions    *streamOptions `json:"stream_options"`
	CacheSalt        *string        `json:"cache_salt"`
	Priority         int            `json:"priority"`
	KVTransferParams any            `json:"kv_transfer_params"`
}

type samplingParams struct {
	MaxTokens int    `json:"max_tokens"`
	MinTokens int    `json:"min_tokens"`
	IgnoreEOS bool   `json:"ignore_eos"`
	Seed      *int64 `json:"seed"`
}

// serveRender handles POST /v1/chat/completions/render and
// /v1/completions/render: the request is parsed and checked as a
// generation request would be (the same errors, not counted as rejected)
// and answered with its prompt's TokenIDs instead of being run. The chat
// render returns one object, the completions render an array with one
// object (the replica concatenates a batch of prompts into one).
func (r *Replica) serveRender(w http.ResponseWriter, hr *http.Request, chat bool) {
	p, e := r.parseGenerate(w, hr, chat)
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	res := renderResult{
		TokenIDs: TokenIDs(p.prompt),
		renderRest: renderRest{
			SamplingParams: samplingParams{
				MaxTokens: p.maxTokens,
				MinTokens: p.in.MinTokens,
				IgnoreEOS: p.in.IgnoreEOS,
				Seed:      p.in.Seed,
			},
			Model:         r.cfg.Model,
			Stream:        p.in.Stream,
			StreamOptions: p.in.StreamOptions,
		},
	}
	id := r.cfg.Name + "-render-" + strconv.FormatUint(r.renderIDs.Add(1), 10)
	bp := renderBufs.Get().(*[]byte)
	defer renderBufs.Put(bp)
	out := (*bp)[:0]
	if chat {
		res.RequestID = "chatcmpl-" + id
		out = appendRender(out, &res)
	} else {
		res.RequestID = "cmpl-" + id
		out = append(appendRender(append(out, '['), &res), ']')
	}
	*bp = out
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// renderBufs holds the buffers answers of serveRender are written in.
var renderBufs = sync.Pool{New: func() any { return new([]byte) }}

// appendRender appends res to dst as JSON, the bytes json.Marshal writes:
// the token ids, most of a long prompt's answer, by hand, and the rest
// through encoding/json.
func appendRender(dst []byte, res *renderResult) []byte {
	id, _ := json.Marshal(res.RequestID)
	dst = append(append(append(dst, `{"request_id":`...), id...), `,"token_ids":`...)
	if res.TokenIDs == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, t := range res.TokenIDs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = strconv.AppendUint(dst, uint64(t), 10)
		}
		dst = append(dst, ']')
	}
	rest, _ := json.Marshal(&res.renderRest)
	return append(append(dst, ','), rest[1:]...)
}

// tokenizeRequest is vLLM's /tokenize request: a completions prompt, or
// chat messages (with tools).
type tokenizeRequest struct {
	Model           string          `json:"model"`
	Prompt          json.RawMessage `json:"prompt"`
	Messages        []chatMessage   `json:"messages"`
	Tools           json.RawMessage `json:"tools"`
	ReturnTokenStrs bool            `json:"return_token_strs"`
}

// serveTokenize handles POST /tokenize: the tokens of messages (rendered as
// a chat request's) or of a prompt (as a completions request's), their
// count and the replica's max_model_len, and with return_token_strs the
// text of every token.
func (r *Replica) serveTokenize(w http.ResponseWriter, hr *http.Request) {
	body, e := readBody(w, hr)
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	var in tokenizeRequest
	if e := r.decodeRequest(body, &in, &in.Model); e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	chat := in.Messages != nil
	if chat && isPresent(in.Prompt) {
		writeError(w, http.StatusBadRequest, "invalid_value", "give either prompt or messages, not both")
		return
	}
	prompt, e := renderInput(chat, in.Tools, in.Messages, in.Prompt)
	if e != nil {
		writeError(w, e.status, e.code, e.msg)
		return
	}
	ids := TokenIDs(prompt)
	var strs []string
	if in.ReturnTokenStrs {
		strs = make([]string, len(ids))
		for i := range strs {
			strs[i] = string(prompt[i*BytesPerToken : min(len(prompt), (i+1)*BytesPerToken)])
		}
	}
	writeJSON(w, struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{len(ids), r.cfg.MaxModelLen, ids, strs})
}

// serveResetPrefixCache handles POST /reset_prefix_cache (vLLM serves it in
// development mode): 200 when the cache was reset (see ResetPrefixCache),
// 409 while requests hold blocks.
func (r *Replica) serveResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	serveReset(w, []*Replica{r})
}

// serveReset resets the prefix cache of each of reps in turn, answering
// 409 at the first that holds blocks for running requests.
func serveReset(w http.ResponseWriter, reps []*Replica) {
	for _, r := range reps {
		if !r.ResetPrefixCache() {
			writeError(w, http.StatusConflict, "blocks_in_use", "the prefix cache cannot be reset while running requests hold blocks")
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func writeJSON(w http.ResponseWriter, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}
