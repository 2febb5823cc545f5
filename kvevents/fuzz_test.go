package kvevents

import (
	"context"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"time"
)

// FuzzDecode feeds Decode arbitrary payloads: it must never panic, and what
// it accepts must survive Encode and Decode again unchanged, in both
// encodings.
func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(20, 2))
	for range 8 {
		b := randBatch(rng)
		for _, enc := range []Encoding{Tagged, Positional} {
			p, err := Encode(b, enc)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	// SGLang: positional, signed hashes, one page per event, a metadata
	// struct where vLLM has lora_name.
	f.Add(pack(f, []any{3.0, []any{
		[]any{"BlockStored", []any{int64(-2)}, int64(-1), []any{10, 11, 12, 13}, 4, nil, "GPU", []any{"salt"}},
		[]any{"BlockRemoved", []any{int64(-2)}, "CPU_PINNED"},
	}, 5}))
	// Older vLLM: digests as hashes, no rank.
	f.Add(pack(f, []any{1.5, []any{
		[]any{"BlockStored", []any{digest("a")}, nil, []any{1, 2}, 2, nil, "GPU"},
		[]any{"AllBlocksCleared"},
	}}))
	// Tagged with an unknown event and unknown keys.
	f.Add(pack(f, om{"ts", 5.0, "events", []any{
		om{"type", "BlockTransferred", "block_hashes", []any{1}},
		om{"type", "BlockRemoved", "block_hashes", []any{1}, "new_field", []any{1, 2}},
	}, "data_parallel_rank", 0}))
	f.Add([]byte{})
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte("not msgpack at all"))
	f.Add([]byte{0x92, 0x01, 0x91, 0x93, 0xa1, 'X', 0x91, 0x91, 0x91, 0xc7, 0xff})

	// The engines' payloads byte for byte.
	for _, s := range engineSamples {
		f.Add(mustHex(s.hex))
	}
	// SGLang's metadata, positional and tagged.
	f.Add(pack(f, []any{2.0, []any{
		[]any{"BlockStored", []any{7}, nil, []any{1, 2}, 2, nil, "GPU", om{"cache_salt", "s", "session_id", "x"}},
	}}))
	f.Add(pack(f, om{"ts", 5.0, "events", []any{
		om{"type", "BlockStored", "block_hashes", []any{1}, "token_ids", []any{1}, "block_size", 1,
			"lora_name", "ad", "metadata", om{"cache_salt", "s"}},
	}}))
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		if err != nil {
			return
		}
		b.Skipped = 0
		for _, enc := range []Encoding{Tagged, Positional} {
			p, err := Encode(b, enc)
			if err != nil {
				t.Fatalf("%v: cannot encode what Decode accepted: %v", enc, err)
			}
			again, err := Decode(p)
			if err != nil {
				t.Fatalf("%v: cannot decode what Encode wrote: %v", enc, err)
			}
			want := b
			if enc == Positional {
				want = positionalSalts(b)
			}
			if math.IsNaN(want.TS) && math.IsNaN(again.TS) {
				want.TS, again.TS = 0, 0 // NaN != NaN
			}
			if !reflect.DeepEqual(again, want) {
				t.Fatalf("%v: round trip changed the batch\n %#v\nto\n %#v", enc, b, again)
			}
		}
	})
}

// positionalSalts is b as the positional encoding gives it back: without
// the cache salt of events that have a LoRA name (both take one place).
func positionalSalts(b Batch) Batch {
	evs := slices.Clone(b.Events)
	for i, ev := range evs {
		if st, ok := ev.(BlockStored); ok && st.LoraName != "" {
			st.CacheSalt = ""
			evs[i] = st
		}
	}
	b.Events = evs
	return b
}

// fuzzMaxEventBytes is FuzzZMTP's bound.
const fuzzMaxEventBytes = 64 << 10

// FuzzZMTP feeds raw ZMTP streams, after a publisher's handshake, to a
// subscriber session through a real TCP socket: it must never panic, and
// never allocate for a frame more than the bound lets through, whatever
// the headers declare (a declared 1 TiB ends the process otherwise).
func FuzzZMTP(f *testing.F) {
	payload, err := Encode(Batch{TS: 1, Events: []Event{
		BlockStored{BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2}, BlockSize: 2},
		BlockRemoved{BlockHashes: []uint64{1}}, AllBlocksCleared{},
	}}, Tagged)
	if err != nil {
		f.Fatal(err)
	}
	good := AppendZMTPMessage(nil, []byte("kv"), seqBytes(0), payload)
	f.Add(good)
	f.Add(append(slices.Clone(good), AppendZMTPMessage(nil, []byte("kv"), seqBytes(5), payload)...))
	f.Add(AppendZMTPHeader(nil, 0, 1<<40))
	f.Add(AppendZMTPHeader(slices.Clone(good), flagMore, 1<<20))
	f.Add(AppendZMTPMessage(nil, make([]byte, 40<<10), make([]byte, 40<<10)))
	f.Add(AppendZMTPHeader(nil, flagCommand, 4))
	f.Add([]byte{0x04, 0x05, 0x04, 'P', 'I', 'N', 'G'})
	f.Add([]byte{0xff, 0x00})
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	f.Fuzz(func(t *testing.T, stream []byte) {
		served := make(chan struct{})
		go func() {
			defer close(served)
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			drained := make(chan struct{})
			go func() { _, _ = io.Copy(io.Discard, c); close(drained) }()
			_, _ = c.Write(append(ZMTPHandshake("PUB"), stream...))
			_ = c.(*net.TCPConn).CloseWrite()
			<-drained // the subscriber closed: all of it was read
		}()
		s, err := newSubscriber(SubOptions{Endpoint: "tcp://" + ln.Addr().String(), Handler: &recorder{},
			MaxEventBytes: fuzzMaxEventBytes, ReplayTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, _ = s.session(ctx)
		runtime.ReadMemStats(&after)
		<-served
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20+16*uint64(len(stream)) {
			t.Fatalf("a stream of %d bytes allocated %d", len(stream), grew)
		}
	})
}
