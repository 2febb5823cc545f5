package router

import (
	"slices"
	"strings"
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

// TestPrepareKeysApartTheAdapter: a request for a LoRA adapter and one for
// its base model with the same messages share no key value, approximate
// or exact, so that neither is routed to the other's cached blocks (the
// engines' events key adapter blocks under the adapter's name too: see
// package precise).
func TestPrepareKeysApartTheAdapter(t *testing.T) {
	tok, err := tokenize.New(tokenize.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rt, err := NewNamed(fleetOf(testFleet(t, 2)), CacheAwareName, Deps{}, tok)
	if err != nil {
		t.Fatal(err)
	}
	ex := &nameExact{}
	rt.SetExact(ex)
	approx, exact := map[string][]uint32{}, map[string][]uint32{}
	for _, model := range []string{"m", "sql-lora"} {
		body := `{"model":"` + model + `","messages":[{"role":"system","content":"` + strings.Repeat("a shared system prompt ", 40) + `"},{"role":"user","content":"same prompt"}]}`
		var req Request
		var bufs oai.Buffers
		if _, err := rt.Prepare(&bufs, oai.KindChat, []byte(body), nil, &req); err != nil {
			t.Fatal(err)
		}
		if len(req.Key) < 2 || len(req.Exact) == 0 {
			t.Fatalf("%s: approximate key of %d values, exact of %d", model, len(req.Key), len(req.Exact))
		}
		approx[model] = append([]uint32(nil), req.Key...)
		exact[model] = append([]uint32(nil), req.Exact...)
		rt.Release(&req)
	}
	for _, v := range approx["m"] {
		if slices.Contains(approx["sql-lora"], v) {
			t.Fatalf("approximate keys of the base model and the adapter share value %d", v)
		}
	}
	if exact["m"][0] == exact["sql-lora"][0] {
		t.Fatal("exact keys of the base model and the adapter share their first value")
	}
}
