package backends

import (
	"testing"

	"github.com/kvroute/kvroute/outcomes"
)

// TestNoteTokenCounts: unknown counts are not compared; a mismatch is
// called once most of the latest comparisons disagreed.
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
	for range outcomes.Size {
		rep.NoteTokenCounts(100, 93)
	}
	if !rep.TokenizerMismatch() {
		t.Fatal("every comparison disagreed, and no mismatch")
	}
}
