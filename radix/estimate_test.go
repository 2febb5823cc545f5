//go:build !race

package radix

import (
	"testing"
)

// TestBytesEstimateTracksHeap checks Stats.Bytes against the heap really
// used by filled trees of several shapes. (Not under -race, which changes
// allocation sizes.)
func TestBytesEstimateTracksHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("fills large trees")
	}
	shapes := map[string]func() *Tree{
		"long":         func() *Tree { return newChatFixture(200, Options{DefaultBudget: 1 << 40}).tr },
		"1000replicas": newReplicasFixture,
		"branchy":      newBranchyFixture,
		"wide":         newWideFixture,
	}
	for name, fill := range shapes {
		measured, estimated := measureBytesPerToken(fill)
		t.Logf("%s: measured %.2f B/token, estimated %.2f B/token", name, measured, estimated)
		if r := estimated / measured; r < 0.75 || r > 1.33 {
			t.Errorf("%s: estimate off by %.2fx", name, r)
		}
	}
}
