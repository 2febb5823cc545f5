// Package kvevents reads the KV cache events that inference engines publish
// about their prefix caches, and publishes them for tests and the simulator.
//
// vLLM (with --kv-events-config) and SGLang publish, over a ZMQ PUB socket,
// multipart messages [topic, 8-byte big-endian sequence, msgpack payload].
// The payload is a batch [timestamp, events, data-parallel rank]; the events
// are BlockStored, BlockRemoved and AllBlocksCleared. Two encodings are in
// use: positional arrays (vLLM before mid-2026, and SGLang) and maps tagged by
// a "type" key (vLLM since). Decode reads both, at the batch level and at the
// event level, and Encode writes either.
//
// A sequence that skips, goes backwards (the engine restarted) or starts a new
// subscription is caught up from the engine's replay socket (a ZMQ ROUTER
// that answers a start sequence with every batch it still keeps, then the
// sequence -1). Subscribe follows one publisher this way and tells its Handler
// to Reset when the replay cannot fill what was missed; Publisher is the
// engine's side, with the same wire format and replay socket.
//
// Only attention cache groups describe prefix-cache content a router can
// index: Attention and Spans say which stored spans to keep.
package kvevents
