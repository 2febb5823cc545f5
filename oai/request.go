// Package oai reads the few fields of an OpenAI-style request body that
// routing needs (model, stream, user and the prompt) without decoding the rest,
// and writes OpenAI-style error bodies.
//
// Copy rules: a parsed Request aliases the body it was parsed from. Its
// strings are valid only while the body is (for a fasthttp handler: until the
// handler returns); callers copy what they keep. See Request.
package oai

// Kind is the shape of a routed request body.
type Kind uint8

// Request kinds, one per routed endpoint family.
const (
	KindOther      Kind = iota // not routed by prompt: forwarded as is
	KindChat                   // POST /v1/chat/completions
	KindCompletion             // POST /v1/completions
	KindEmbedding              // POST /v1/embeddings
	KindResponses              // POST /v1/responses
	KindGenerate               // SGLang native POST /generate
)

// String names the kind for logs and metrics.
func (k Kind) String() string {
	switch k {
	case KindChat:
		return "chat"
	case KindCompletion:
		return "completion"
	case KindEmbedding:
		return "embedding"
	case KindResponses:
		return "responses"
	case KindGenerate:
		return "generate"
	}
	return "other"
}

// KindForPath maps a request path to its kind; KindOther for paths that are
// not routed by prompt.
func KindForPath(path string) Kind {
	switch path {
	case "/v1/chat/completions":
		return KindChat
	case "/v1/completions":
		return KindCompletion
	case "/v1/embeddings":
		return KindEmbedding
	case "/v1/responses":
		return KindResponses
	case "/generate":
		return KindGenerate
	}
	return KindOther
}

// Part is one piece of a message's content. Text parts carry their text;
// any other part (an image, audio, a file) carries a stable 64-bit hash of its
// JSON so that different images never produce the same routing key: FNV-1a
// over the part's JSON text with the whitespace outside strings removed and
// strings kept as written, so the same part sent again hashes the same.
type Part struct {
	Text   string
	Hash   uint64
	IsText bool
}

// Message is one chat message in order: its role and the parts of its
// content. A plain string content is one text part. Name and tool-call
// payloads are folded into Parts as text so they shape the key too.
type Message struct {
	Role  string
	Parts []Part
	// Raw is the message's JSON as written in the body (the object, or the
	// quoted string of a responses input given as a string), or "" for a
	// message not read from one (a responses request's instructions). Within
	// one Kind, equal Raw texts give equal Role and Parts.
	Raw string
}

// Prompt is the prompt of a completion-style request: either texts (a string
// or a list of strings) or token IDs given by the client (used as given).
type Prompt struct {
	Texts  []string
	Tokens [][]uint32
}

// Request holds the routing fields of one request body.
//
// Copy rule: valid only while the body is; callers copy what they keep
// (strings.Clone). Parse copies no text it can alias: a string without escape
// sequences in the body (Model, User, roles, texts) points into the body
// bytes, and so does Tools, a folded tool call or a responses item when its
// JSON has no whitespace to remove. Strings with escapes, compacted JSON and
// name parts are decoded into memory of the Request's own, but nothing says
// which a given string is: treat every string as borrowed from the body. The
// body must not be modified while the Request is in use.
type Request struct {
	Kind   Kind
	Model  string
	Stream bool
	// User is the OpenAI "user" field, used as a session identity when no
	// session header is present.
	User string
	// CacheSalt is vLLM's "cache_salt" field, at most MaxCacheSaltBytes
	// (empty when absent, null or empty): the engine keeps the prefix
	// cache of each salt apart, and so do routing keys (tokenize.SaltedName).
	// It is a secret of the client's: never log it.
	CacheSalt string
	// Priority is vLLM's "priority" field when it is an integer in 32
	// bits (HasPriority): lower is served first.
	Priority    int
	HasPriority bool
	// Tools is the compact JSON of the "tools" array (its text with the
	// whitespace outside strings removed; strings kept as written), or empty.
	Tools string
	// Messages of a chat request (and of a responses request's input items),
	// in order. System or developer instructions come first.
	Messages []Message
	// Prompt of a completion, embedding or generate request.
	Prompt Prompt
	// PreviousResponseID is a responses request's "previous_response_id"
	// when it is a string (the stored response the request continues), or
	// empty. Any other type is left to the replica to reject.
	PreviousResponseID string
	// Truncated: the body's messages, parts or prompt lists would cost
	// more memory than Parse spends on a body of its size (about four
	// times the body), so those past that point were checked but are not
	// in the Request: Messages and Prompt hold the prompt's first ones
	// only. Only bodies of thousands of near-empty elements are.
	Truncated bool
}
