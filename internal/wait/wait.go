// Package wait is the tests' one way to wait for a condition: poll it
// until it holds, failing the test past a deadline. It imports nothing of
// kvroute, so every package's tests may use it.
package wait

import (
	"testing"
	"time"
)

// For polls cond every few milliseconds until it holds, failing t when d
// passes first; what names the condition in the failure.
func For(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
