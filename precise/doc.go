// Package precise is kvroute's precise mode: the Index follows what the
// engines report holding, keyed by the engines' own tokens, beside the
// approximate entries the router places from its own tokenizer.
//
// # Events
//
// Events subscribes to each replica's KV cache events (package kvevents)
// and writes them into the index.Index as SourceEngine entries (through its
// index.EngineWriter), keyed by the router's own chained hash of the blocks' token ids (tokenize.Chain,
// the key tokenize.AppendExactKey gives a request's exact tokens). Engine
// block hashes cannot be reproduced outside the engine, so each replica has
// a map from engine hash to the block's place in the router's key: its
// parent block, its key values and the chain after them. A BlockStored run
// is chained from its parent's entry (or from a new chain of its lora_name,
// else the replica's model, when it has none) and its path from the first
// block is placed, as far as the engine still holds every block on it; a
// run whose parent is unknown (its store was missed) is counted and left
// out, not guessed. A BlockRemoved evicts the
// block's values and everything past them (the engine cannot hit a block
// whose prefix it lost); AllBlocksCleared, a Reset of the subscription (an
// engine restart, or batches lost that no replay gives back) and the end of
// a Follow evict every path the replica's map placed, and nothing the
// router placed elsewhere.
//
// Only attention cache groups are indexed (kvevents.Indexable): blocks of
// Mamba and sliding-window groups, and spans whose token count is not
// their blocks times the block size, are skipped and counted, and removals
// in those groups ignored (hybrid models report the same hashes in every
// group). Blocks of every medium count as held, the CPU tier's too: the
// engine loads them back instead of computing them, so a request hits
// them. A block is held while any of its stores (per medium, per group,
// per copy) is not yet removed.
//
// A run whose first block carries a cache salt (in its extra keys, or in
// SGLang's metadata) and nothing else but its LoRA adapter's name is
// chained from tokenize.SaltedName of its name and salt, where requests of
// that salt are keyed, and placed as any other. A block the engine hashed
// with other inputs (multimodal hashes) is kept, for the blocks chained to
// it, but neither it nor what follows it is placed: a request's key is made
// of tokens alone and must not match it.
// An adapter named only by number (lora_id) keys its blocks under a name
// no request uses.
//
// Blocks are known by their engine hash within a namespace (the event's
// adapter and SGLang's metadata salt): SGLang's hashes leave both out, so
// a base-model block and an adapter's, or two tenants' salted blocks, with
// equal tokens share a hash, and keyed on the hash alone the second would
// be taken for a second store of the first. A removal names the hash
// alone and takes it from every namespace holding it: a block the engine
// still holds may be missed, none it evicted is kept.
//
// The engine's block size need not be the key block. The path's tokens are
// cut in key blocks as a stream: a key value is held once the engine block
// holding the last of its tokens is, and a removed engine block takes out
// the key value its first token belongs to and all after it. An engine
// block of several key blocks holds several values; blocks smaller than a
// key block (SGLang's pages) complete a value every few blocks, whatever
// the ratio, multiple, divisor or neither; the tokens past the last whole
// key block wait in the block for the next one.
//
// Events.Live says when a replica's engine entries can be trusted: its
// stream is connected and flowing (see Live); EventsOptions.OnLive hears of
// every change, to switch the replica between precise and approximate.
// What the Index holds is never more than the engine reported holding; it
// can be less when events were lost (ReplicaStatus.Complete): blocks stored
// before the loss are learnt of again only when the engine stores them
// again.
//
// A replica's map costs about 80 bytes per engine block of a key block's
// size and 240 per one-token page; past twice the replica's capacity in
// blocks (at most EventsOptions.MaxBlocks) it is dropped and rebuilt from
// the events that follow.
package precise
