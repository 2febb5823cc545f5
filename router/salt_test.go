package router

import (
	"testing"

	"github.com/kvroute/kvroute/oai"
	"github.com/kvroute/kvroute/tokenize"
)

// nameExact is an Exact that records the name it was asked to key under
// and keys one block of it.
type nameExact struct{ names []string }

func (e *nameExact) ExactKey(dst []uint32, _ oai.Kind, name string, _ []byte) ([]uint32, int, bool) {
	e.names = append(e.names, name)
	return tokenize.AppendExactKey(dst, name, make([]uint32, 16), 16), 16, true
}

// TestPrepareKeysUnderTheSalt: Prepare asks the Exact for a salted
// request's key under tokenize.SaltedName of its model and salt, so that
// its exact key is the one the engines' events of that salt are recorded
// under; an unsalted request's under its model.
func TestPrepareKeysUnderTheSalt(t *testing.T) {
	tok, err := tokenize.New(tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reps := testFleet(t, 2)
	rt, err := NewNamed(fleetOf(reps), CacheAwareName, Deps{}, tok)
	if err != nil {
		t.Fatal(err)
	}
	ex := &nameExact{}
	rt.SetExact(ex)
	exact := map[string][]uint32{}
	for _, salt := range []string{"", "a", "b"} {
		body := `{"model":"m","messages":[{"role":"user","content":"same prompt"}]`
		if salt != "" {
			body += `,"cache_salt":"` + salt + `"`
		}
		var req Request
		var bufs oai.Buffers
		if _, err := rt.Prepare(&bufs, oai.KindChat, []byte(body+"}"), nil, &req); err != nil {
			t.Fatal(err)
		}
		if got, want := ex.names[len(ex.names)-1], tokenize.SaltedName("m", salt); got != want {
			t.Errorf("salt %q: keyed under %q, want %q", salt, got, want)
		}
		exact[salt] = append([]uint32(nil), req.Exact...)
		rt.Release(&req)
	}
	if exact[""][0] == exact["a"][0] || exact["a"][0] == exact["b"][0] || exact[""][0] == exact["b"][0] {
		t.Errorf("exact keys of different salts share a value: %v", exact)
	}
}
