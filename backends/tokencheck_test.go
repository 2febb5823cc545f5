package backends

import (
	"math/rand/v2"
	"testing"
)

// TestTokenCheck: a mismatch is called once most of at least
// tokenCheckMin of the latest tokenCheckWindow comparisons disagreed, and
// no longer once most agree; against a plain list of the comparisons.
func TestTokenCheck(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var c tokenCheck
	const n = 2000
	all := make([]bool, 0, n)
	for i := range n {
		// Phases of agreement and of disagreement, with noise.
		bad := (i/150)%2 == 1
		if r.IntN(10) == 0 {
			bad = !bad
		}
		c.note(bad)
		all = append(all, bad)
		last := all[max(0, len(all)-tokenCheckWindow):]
		n := 0
		for _, b := range last {
			if b {
				n++
			}
		}
		want := len(last) >= tokenCheckMin && 2*n > len(last)
		if got := c.mismatch(); got != want {
			t.Fatalf("after %d comparisons (%d of the last %d disagreed): mismatch %v, want %v", i+1, n, len(last), got, want)
		}
	}
}

// TestNoteTokenCounts: unknown counts are not compared; equal ones agree.
func TestNoteTokenCounts(t *testing.T) {
	f, err := NewFleet([]Spec{{Name: "a", URL: "http://127.0.0.1:21200", Engine: EngineVLLM, Models: []string{"m"}}}, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rep := f.Replicas()[0]
	for range tokenCheckMin {
		rep.NoteTokenCounts(0, 100)
		rep.NoteTokenCounts(100, 0)
	}
	if rep.TokenizerMismatch() {
		t.Fatal("a mismatch from counts that were never compared")
	}
	for range tokenCheckMin {
		rep.NoteTokenCounts(100, 100)
		rep.NoteTokenCounts(100, 104)
	}
	if rep.TokenizerMismatch() {
		t.Fatal("half the comparisons disagreeing is a mismatch")
	}
	for range tokenCheckWindow {
		rep.NoteTokenCounts(100, 93)
	}
	if !rep.TokenizerMismatch() {
		t.Fatal("every comparison disagreed, and no mismatch")
	}
}
