package backends

import (
	"math"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestWeightValidation checks which weights a fleet accepts and what
// Replica.Weight reports for them.
func TestWeightValidation(t *testing.T) {
	cases := []struct {
		name   string
		weight float64
		want   float64 // 0: rejected
	}{
		{"unset is 1", 0, 1},
		{"fraction", 0.5, 0.5},
		{"three", 3, 3},
		{"negative", -1, 0},
		{"NaN", math.NaN(), 0},
		{"infinite", math.Inf(1), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			specs := []Spec{{Name: "a", URL: "http://127.0.0.1:20300", Engine: EngineVLLM, Weight: tc.weight}}
			f, err := NewFleet(specs, Options{}, zap.NewNop())
			if tc.want == 0 {
				if err == nil || !strings.Contains(err.Error(), `replica "a": weight must be a positive number`) {
					t.Errorf("NewFleet with weight %v: err %v, want a weight error naming the replica", tc.weight, err)
				}
				if ValidateSpecs(specs) == nil {
					t.Errorf("ValidateSpecs accepted weight %v", tc.weight)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := f.Replicas()[0].Weight(); got != tc.want {
				t.Errorf("Weight() = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestUpdateKeepsReplicaWhenWeightOrBackupChange reloads a fleet changing
// only weights and the backup flag: the replicas and their state are kept,
// and the accessors report the new values.
func TestUpdateKeepsReplicaWhenWeightOrBackupChange(t *testing.T) {
	specs := []Spec{
		{Name: "a", URL: "http://127.0.0.1:20301", Engine: EngineVLLM},
		{Name: "b", URL: "http://127.0.0.1:20302", Engine: EngineVLLM, Backup: true},
	}
	f, err := NewFleet(specs, Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	a, b := f.ByName("a"), f.ByName("b")
	release := a.Acquire()
	defer release()
	if a.Weight() != 1 || a.Backup() || !b.Backup() {
		t.Fatalf("before reload: a weight %v backup %v, b backup %v", a.Weight(), a.Backup(), b.Backup())
	}
	specs[0].Weight, specs[0].Backup, specs[1].Backup = 2.5, true, false
	added, removed, err := f.Update(specs)
	if err != nil {
		t.Fatal(err)
	}
	if len(added)+len(removed) != 0 || f.ByName("a") != a || f.ByName("b") != b {
		t.Fatalf("weight/backup change replaced replicas: added %d removed %d", len(added), len(removed))
	}
	if a.InFlight() != 1 || a.ID() != 0 || b.ID() != 1 {
		t.Errorf("state lost: a in flight %d, IDs %d %d", a.InFlight(), a.ID(), b.ID())
	}
	if a.Weight() != 2.5 || !a.Backup() || b.Backup() {
		t.Errorf("after reload: a weight %v backup %v, b backup %v; want 2.5 true false", a.Weight(), a.Backup(), b.Backup())
	}
	if s := a.Spec(); s.Weight != 2.5 || !s.Backup {
		t.Errorf("Spec() = %+v, want weight 2.5 and backup", s)
	}
}
