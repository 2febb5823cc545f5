package backends

import (
	"fmt"
	"math"
)

// checkWeight rejects a Spec.Weight no policy can divide by: negative, NaN
// or infinite. 0 stands for the default, 1.
func checkWeight(w float64) error {
	if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
		return fmt.Errorf("weight must be a positive number (default 1), got %v", w)
	}
	return nil
}

// Weight returns the replica's relative capacity: its spec's Weight, or 1
// when that is 0 (unset). Always positive and finite. A reload
// ([Fleet.Update]) that changes only the weight keeps the replica and its
// state, and the new weight applies from the next routing decision.
func (r *Replica) Weight() float64 {
	if w := r.spec.Load().spec.Weight; w > 0 {
		return w
	}
	return 1
}

// Backup reports whether the replica is a backup: routed to only when no
// primary replica is available (see [Spec.Backup]). Like the weight, it
// follows [Fleet.Update].
func (r *Replica) Backup() bool { return r.spec.Load().spec.Backup }
