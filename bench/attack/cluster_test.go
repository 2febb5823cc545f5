package attack

import "testing"

// The cluster attacks, at reduced size, against real kvroute processes and
// real NATS servers on 127.0.0.1: each holds (the placements flood runs in
// TestMemoryUnderFormulaWhileAttacked).
func TestClusterAttacksHold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kvroute processes and NATS servers")
	}
	e := testEnv(t)
	for _, tc := range []struct {
		name string
		run  func(e *env) (Result, error)
	}{
		{"rogue join", clusterRogueJoin},
		{"forged load", func(e *env) (Result, error) { return forgedLoad(e, 12) }},
		{"forged lead", func(e *env) (Result, error) { return forgedLead(e, 12) }},
		{"peer ids", func(e *env) (Result, error) { return peerIDs(e, 500) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.run(e)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r.Figure)
			if !r.Held {
				t.Errorf("did not hold: %s", r.Figure)
			}
		})
	}
}
