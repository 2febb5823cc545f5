package tokenize

// Chain is the running hash of a routing key built from an engine's own
// token ids (precise mode): the same block hash as the tokenizer's keys,
// started from a seed of its own so that exact and approximate keys of one
// model share no values. A Chain is a value; Next returns the next one.
type Chain uint64

// NewChain starts the exact key of model (or LoRA adapter) name.
func NewChain(model string) Chain { return Chain(modelSeed("\x00exact\x00" + model)) }

// Next folds one block of token ids into the chain and returns the chain
// after it and the block's key value.
func (c Chain) Next(block []uint32) (Chain, uint32) {
	h := hashBlock(uint64(c), block)
	return Chain(h), blockValue(h)
}

// AppendExactKey appends to dst the exact key of toks for model: one value
// per whole block of block tokens (a trailing partial block has none), and
// returns it.
func AppendExactKey(dst []uint32, model string, toks []uint32, block int) []uint32 {
	if block <= 0 {
		return dst
	}
	c := NewChain(model)
	var v uint32
	for len(toks) >= block {
		c, v = c.Next(toks[:block])
		dst = append(dst, v)
		toks = toks[block:]
	}
	return dst
}

// SaltedName is the name a key of model under the engine cache salt salt
// starts from (vLLM's cache_salt: the engine mixes it into its block
// hashes, so blocks of different salts never match). Without a salt it is
// model itself; with one, no key of another salt, or of none, shares a
// value with it. Approximate keys, exact keys and the engines' events all
// start from it.
func SaltedName(model, salt string) string {
	if salt == "" {
		return model
	}
	return model + "\x00cache_salt\x00" + salt
}
