package attack

import (
	"runtime"
	"testing"
)

// The request-side attacks at a reduced size: 4 requests of 20,000
// messages at once stay within the per-request allowance; with the
// defaults no answer tells a right guess of another client's prompt from
// a wrong one; clients of different cache salts never hit each other's
// entries.
func TestRequestAttacks(t *testing.T) {
	e := testEnv(t)
	runs := []struct {
		name string
		run  func(*env) (Result, error)
	}{{"route-oracle", routeOracle}, {"salt-isolation", saltIsolation}}
	if runtime.GOOS == "linux" {
		prevN, prevM := manyRequests, manyMessagesEach
		manyRequests, manyMessagesEach = 4, 20_000
		t.Cleanup(func() { manyRequests, manyMessagesEach = prevN, prevM })
		runs = append(runs, struct {
			name string
			run  func(*env) (Result, error)
		}{"many-messages", manyMessages})
	}
	for _, r := range runs {
		res, err := r.run(e)
		if err != nil {
			t.Fatalf("%s: %v", r.name, err)
		}
		t.Logf("%s: %s", r.name, res.Figure)
		if !res.Held {
			t.Errorf("%s did not hold: %s", r.name, res.Figure)
		}
	}
}
