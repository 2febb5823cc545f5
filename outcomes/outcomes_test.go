package outcomes

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// TestWindow: against a plain list of every outcome, Mostly says whether
// more than half of the latest Size (or fewer, while fewer were noted)
// were bad, once at least least were noted; Reset forgets them.
func TestWindow(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, least = 2000, 8
	var w Window
	all := make([]bool, 0, n)
	for i := range n {
		// Phases of good and of bad outcomes, with noise.
		bad := (i/150)%2 == 1
		if r.IntN(10) == 0 {
			bad = !bad
		}
		w.Note(bad)
		all = append(all, bad)
		last := all[max(0, len(all)-Size):]
		nb := 0
		for _, b := range last {
			if b {
				nb++
			}
		}
		want := len(last) >= least && 2*nb > len(last)
		if got := w.Mostly(least); got != want {
			t.Fatalf("after %d outcomes (%d of the last %d bad): Mostly %v, want %v", i+1, nb, len(last), got, want)
		}
	}
	w.Reset()
	if w.Mostly(0) || w.v.Load() != 0 {
		t.Fatal("a reset window still holds outcomes")
	}
}

// TestWindowConcurrent: notes from many goroutines are all counted.
func TestWindowConcurrent(t *testing.T) {
	var w Window
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range Size {
				w.Note(true)
			}
		})
	}
	wg.Wait()
	if w.v.Load() != Size<<Size|histMask {
		t.Fatalf("window %x after %d bad outcomes", w.v.Load(), 8*Size)
	}
}
