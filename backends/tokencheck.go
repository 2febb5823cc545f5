package backends

// tokenCheckMin is how many of the latest comparisons of prompt lengths
// (NoteTokenCounts) are needed before a mismatch is called.
const tokenCheckMin = 8

// NoteTokenCounts records that a request whose prompt was rendered
// rendered tokens long (kvroute's exact key, precise mode) was reported
// by the replica's engine as reported prompt tokens long. A renderer that
// tokenizes otherwise than the engine (another model's tokenizer or chat
// template) gives exact keys that none of the engine's KV events match,
// and lengths that differ: a silent failure this makes visible. Counts of
// 0 (none known) are not compared.
func (r *Replica) NoteTokenCounts(rendered, reported int) {
	if rendered <= 0 || reported <= 0 {
		return
	}
	r.tokens.Note(rendered != reported)
}

// TokenizerMismatch reports whether the prompt lengths kvroute's renderer
// gave for most of the replica's latest requests (outcomes.Size, at least
// tokenCheckMin of them) differ from those its engine reported
// (NoteTokenCounts): the renderer tokenizes otherwise than the engine, and
// exact keys would not match its KV events.
func (r *Replica) TokenizerMismatch() bool { return r.tokens.Mostly(tokenCheckMin) }
