package kvevents

// Batch is one published message: the events an engine emitted together.
type Batch struct {
	// TS is when the engine sent the batch, in seconds since the Unix epoch.
	TS     float64
	Events []Event
	// DPRank is the data-parallel rank of the publishing engine (0 when
	// the batch does not say).
	DPRank int
	// Skipped counts the events Decode left out because their type is not
	// one of the three known ones. Encode ignores it.
	Skipped int
}

// Event is one of BlockStored, BlockRemoved or AllBlocksCleared.
type Event interface {
	// Type is the event's tag on the wire ("BlockStored", ...).
	Type() string
	isEvent()
}

// Event type tags, as the engines send them.
const (
	TypeBlockStored      = "BlockStored"
	TypeBlockRemoved     = "BlockRemoved"
	TypeAllBlocksCleared = "AllBlocksCleared"
)

// Keys of the tagged encoding, which are also the fields' names.
const (
	keyType         = "type"
	keyTS           = "ts"
	keyEvents       = "events"
	keyDPRank       = "data_parallel_rank"
	keySGLangDPRank = "attn_dp_rank"
	keyHashes       = "block_hashes"
	keyParent       = "parent_block_hash"
	keyTokens       = "token_ids"
	keyBlockSize    = "block_size"
	keyLoraID       = "lora_id"
	keyMedium       = "medium"
	keyLoraName     = "lora_name"
	keyExtraKeys    = "extra_keys"
	keyGroup        = "group_idx"
	keySpecKind     = "kv_cache_spec_kind"
	keyMetadata     = "metadata"   // SGLang's, in place of lora_name
	keyCacheSalt    = "cache_salt" // in SGLang's metadata, and a tag of vLLM's extra keys
)

// BlockStored says the engine now caches a run of consecutive full blocks.
type BlockStored struct {
	// BlockHashes are the engine's hashes of the blocks, in order. They
	// are not reproducible outside the engine; they identify blocks in
	// later events (ParentHash, BlockRemoved).
	BlockHashes []uint64
	// ParentHash is the hash of the block before the first one, when
	// HasParent; without a parent the run starts the sequence.
	ParentHash uint64
	HasParent  bool
	// TokenIDs are the tokens of all the blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// LoraID (deprecated by vLLM, still sent by SGLang) and LoraName name
	// the adapter the blocks were computed with; 0 and "" for none.
	LoraID   int64
	LoraName string
	// Medium is where the blocks live ("GPU", "CPU", ...); "" when unsent.
	Medium string
	// ExtraKeys holds, per block, the msgpack encoding of the extra inputs
	// vLLM mixed into that block's hash (multimodal ids, LoRA name,
	// cache_salt on the first block), nil for a block without any; the
	// whole slice is nil when the event carries none.
	ExtraKeys [][]byte
	// CacheSalt is the cache_salt SGLang's metadata names ("" for none);
	// vLLM's is in the first block's ExtraKeys (see ReadBlockKeys).
	CacheSalt string
	// GroupIdx is the KV cache group of the blocks; hybrid models emit one
	// BlockStored per group.
	GroupIdx int
	// SpecKind is the group's kv_cache_spec_kind ("full_attention",
	// "sliding_window", "mamba", ...); "" when unsent. See Attention.
	SpecKind string
}

// BlockRemoved says the engine evicted blocks.
type BlockRemoved struct {
	BlockHashes []uint64
	Medium      string
	GroupIdx    int
}

// AllBlocksCleared says the engine dropped its whole prefix cache.
type AllBlocksCleared struct{}

// Type implements Event.
func (BlockStored) Type() string { return TypeBlockStored }

// Type implements Event.
func (BlockRemoved) Type() string { return TypeBlockRemoved }

// Type implements Event.
func (AllBlocksCleared) Type() string { return TypeAllBlocksCleared }

func (BlockStored) isEvent()      {}
func (BlockRemoved) isEvent()     {}
func (AllBlocksCleared) isEvent() {}

// Attention reports whether a cache group of the given kv_cache_spec_kind
// holds attention KV that a later request with the same prefix reuses, so
// that its blocks belong in a prefix index: full, MLA and sink-full
// attention, and "" (engines that do not send the kind have one full
// attention group). Mamba state, sliding-window and chunked-local groups
// keep only part of a prefix and are left out.
func Attention(kind string) bool {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full":
		return true
	}
	return false
}

// Spans reports whether ev's tokens are exactly its blocks: BlockSize tokens
// for each hash, with a positive BlockSize. A group whose events fail this
// cannot be keyed by its tokens (hybrid models have sent such spans).
func Spans(ev BlockStored) bool {
	return ev.BlockSize > 0 && len(ev.TokenIDs) == len(ev.BlockHashes)*ev.BlockSize
}

// Indexable reports whether ev describes prefix-cache blocks to index: an
// attention group (Attention) with whole spans (Spans).
func Indexable(ev BlockStored) bool {
	return Attention(ev.SpecKind) && Spans(ev)
}
