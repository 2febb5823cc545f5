package router

import (
	"testing"
	"time"
)

// matchOf is the longest prefix of key replica 0 holds, in tokens.
func matchOf(ix *Index, key []uint32) int {
	for _, m := range ix.Match(nil, key, time.Time{}) {
		if m.Replica == 0 {
			return m.Tokens
		}
	}
	return 0
}

func TestFeedbackTrimsPastWhatTheEngineFound(t *testing.T) {
	const kb = 16
	join := func(parts ...[]uint32) []uint32 {
		var k []uint32
		for _, p := range parts {
			k = append(k, p...)
		}
		return k
	}
	sys := seqKey(1, 64)                     // a shared system prompt: 64 values, 1024 tokens
	a := seqKey(2, 64)                       // conversation A's history
	other := join(sys, seqKey(3, 64))        // B branches at the end of sys
	deep := join(sys, a[:10], seqKey(4, 40)) // D branches inside A's history
	for _, tt := range []struct {
		name     string
		reported int // engine's cached tokens for C
		trimmed  bool
	}{
		{"evicted past the system prompt", len(sys) * kb, true},
		{"within the tokenizers' slack", (len(sys)+len(a))*kb - 32, false},
		{"all found", (len(sys) + len(a)) * kb, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ix := NewIndex(IndexOptions{KeyBlock: kb})
			tun := NewTunings(Tuning{CacheAware: CacheAwareTuning{Lambda: 1, Epsilon: 1, MinMatchTokens: 256, BlockSize: kb, TTL: time.Hour}})
			pol, err := NewPolicy(CacheAwareName, Deps{Index: ix, Tuning: tun})
			if err != nil {
				t.Fatal(err)
			}
			reps := stateFleet(t, ix, nil, []repState{{}})
			now := time.Now()
			ix.Place(SourceRouter, join(sys, a), reps[0], now)
			ix.Place(SourceRouter, other, reps[0], now)
			ix.Place(SourceRouter, deep, reps[0], now)
			c := join(sys, a, seqKey(5, 20))
			dec := pol.Pick(&Request{Key: c}, reps)
			if dec.Matched != (len(sys)+len(a))*kb {
				t.Fatalf("predicted %d tokens, want %d", dec.Matched, (len(sys)+len(a))*kb)
			}
			if got := dec.Feedback(tt.reported); got != tt.trimmed {
				t.Fatalf("Feedback(%d) trimmed %v, want %v", tt.reported, got, tt.trimmed)
			}
			wantDeep := len(deep) * kb
			if tt.trimmed {
				// Its own branch, below the evicted part, is gone; what it
				// shares with C, just prefilled again, is held.
				wantDeep = (len(sys) + 10) * kb
			}
			if got := matchOf(ix, deep); got != wantDeep {
				t.Errorf("D (branching inside the evicted part): held %d tokens, want %d", got, wantDeep)
			}
			if got := matchOf(ix, other); got != len(other)*kb {
				t.Errorf("B (branching where the engine's cache still reaches): held %d tokens, want %d", got, len(other)*kb)
			}
			if got := matchOf(ix, c); got != len(c)*kb {
				t.Errorf("C itself (just prefilled again): held %d tokens, want %d", got, len(c)*kb)
			}
			if want := map[bool]uint64{true: 1, false: 0}[tt.trimmed]; ix.Trims() != want {
				t.Errorf("trims %d, want %d", ix.Trims(), want)
			}
		})
	}
}
