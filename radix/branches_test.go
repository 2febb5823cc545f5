package radix

import (
	"slices"
	"testing"
	"time"
)

func TestBranches(t *testing.T) {
	now := time.Now()
	old := now.Add(-time.Hour)
	tr := New(Options{})
	sys := []uint32{1, 2, 3, 4}
	ins := func(r ReplicaID, at time.Time, rest ...uint32) {
		tr.Insert(append(slices.Clone(sys), rest...), r, at)
	}
	ins(0, now, 10, 11)
	ins(0, now, 20)
	ins(1, now, 30, 31, 32)
	ins(2, old, 40) // too old to count
	ins(0, now)     // the prefix itself
	tests := []struct {
		name  string
		key   []uint32
		depth int
		want  []int32 // by replica
		n     int
	}{
		{"at the shared prefix", []uint32{1, 2, 3, 4, 99}, 4, []int32{2, 1}, 3},
		{"the key's own continuation is not counted", []uint32{1, 2, 3, 4, 10, 11, 12}, 4, []int32{1, 1}, 2},
		{"inside a label: its rest", []uint32{1, 2, 3, 4, 30, 99}, 5, []int32{0, 1}, 1},
		{"inside the shared label", []uint32{1, 2, 7}, 2, []int32{1, 1}, 1}, // replica 2's use is too old
		{"not held to depth", []uint32{1, 9, 9, 9}, 3, nil, 0},
		{"depth 0", []uint32{1}, 0, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, n := tr.Branches(nil, tt.key, tt.depth, now.Add(-time.Minute))
			for len(got) < len(tt.want) {
				got = append(got, 0)
			}
			for len(got) > len(tt.want) && got[len(got)-1] == 0 {
				got = got[:len(got)-1]
			}
			if n != tt.n || !slices.Equal(got, tt.want) {
				t.Errorf("Branches = %v, %d; want %v, %d", got, n, tt.want, tt.n)
			}
		})
	}
	occ := tr.Occupancies(nil, []ReplicaID{1, 9})
	if want := []Occupancy{{7, DefaultBudget}, {0, DefaultBudget}}; !slices.Equal(occ, want) {
		t.Errorf("Occupancies = %v, want %v", occ, want)
	}
}

// Past MaxBranches, a wide node's latest continuations are the ones
// counted: the first ones ever made may be conversations long over.
func TestBranchesCountsTheLatest(t *testing.T) {
	now := time.Now()
	tr := New(Options{})
	sys := []uint32{1, 2, 3, 4}
	const first, later = 200, 100
	for i := range first + later {
		r := ReplicaID(0)
		if i >= first {
			r = 1
		}
		tr.Insert(append(slices.Clone(sys), uint32(1000+i), uint32(5000+i)), r, now)
	}
	got, n := tr.Branches(nil, []uint32{1, 2, 3, 4, 9}, 4, now.Add(-time.Minute))
	for len(got) < 2 {
		got = append(got, 0)
	}
	if want := []int32{MaxBranches - later, later}; n != MaxBranches || !slices.Equal(got[:2], want) {
		t.Errorf("Branches = %v, %d; want %v, %d", got, n, want, MaxBranches)
	}
}
