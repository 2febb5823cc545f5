// Package prose holds the vocabulary of the generated English text that
// benchmarks send or encode, so that the router's multi-turn benchmark and
// the tokenizer's prose benchmark measure the same kind of text.
package prose

// Words are common English words, each about one token, so a text made of
// them has a realistic token count for its size.
var Words = []string{
	"the", "model", "cache", "request", "answer", "question", "server", "prefix", "token", "memory",
	"a", "of", "to", "and", "in", "is", "that", "for", "it", "with", "as", "was", "on", "be",
	"latency", "throughput", "replica", "router", "queue", "batch", "prompt", "stream", "event",
	"time", "people", "year", "way", "day", "thing", "world", "life", "hand", "part", "place",
	"case", "week", "system", "program", "number", "group", "problem", "fact", "good", "new",
	"first", "last", "long", "great", "little", "own", "other", "old", "right", "big",
}
