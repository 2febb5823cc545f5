package tokenize

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/oai"
)

// TestSaltedKeysShareNoValue: the same prompt under salts a, b and none
// gets block keys that share no value, first turn or next (through the
// conversation cache); the same salt gets the same key.
func TestSaltedKeysShareNoValue(t *testing.T) {
	tk, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	long := "a system prompt long enough to make several blocks of tokens, repeated. "
	for range 4 {
		long += long
	}
	turn := func(salt string, n int) []byte {
		b := `{"model":"m","messages":[{"role":"system","content":"` + long + `"}`
		for i := range n {
			b += `,{"role":"user","content":"question ` + string(rune('a'+i)) + ` of a conversation long enough"}`
		}
		if salt != "" {
			b += `],"cache_salt":"` + salt + `"}`
		} else {
			b += `]}`
		}
		return []byte(b)
	}
	for _, n := range []int{1, 2, 3} {
		keys := map[string][]uint32{}
		for _, salt := range []string{"", "a", "b", "a"} {
			req, err := oai.Parse(oai.KindChat, turn(salt, n))
			if err != nil {
				t.Fatal(err)
			}
			key, _ := tk.AppendBlocks(nil, req)
			if len(key) < 4 {
				t.Fatalf("key of %d blocks", len(key))
			}
			if prev, ok := keys[salt]; ok {
				if !slices.Equal(prev, key) {
					t.Errorf("turn %d, salt %q: two keys for one prompt", n, salt)
				}
				continue
			}
			for other, okey := range keys {
				if v, shared := sharedValue(okey, key); shared {
					t.Errorf("turn %d: salts %q and %q share the value %#x", n, salt, other, v)
				}
			}
			keys[salt] = key
		}
	}
}

func sharedValue(a, b []uint32) (uint32, bool) {
	in := map[uint32]bool{}
	for _, v := range a {
		in[v] = true
	}
	for _, v := range b {
		if in[v] {
			return v, true
		}
	}
	return 0, false
}
