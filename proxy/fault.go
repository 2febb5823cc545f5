package proxy

import "fmt"

// streamFault is what a relayed stream whose replica failed mid-body
// reports to the replica: err, the replica body's read error, decides
// whether it counts (backends.IsReplicaFault); a nil err, a failure of
// unknown cause, counts.
func streamFault(err error) error {
	if err == nil {
		return fmt.Errorf("stream interrupted")
	}
	return fmt.Errorf("stream interrupted: %w", err)
}
