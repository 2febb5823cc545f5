package attack

import (
	"testing"
)

// The KV-event attacks at reduced sizes, each against its own kvroute in
// precise mode: a frame header declaring 1 TiB, a streamed frame of
// 256 MiB, 20,000 garbage messages and 300 connections to a listening
// socket from an address it does not allow (the block flood runs in
// TestMemoryUnderFormulaWhileAttacked). Each must hold: kvroute lives,
// counts the rejection, still answers, keeps its log and memory small.
// Without the guard the 1 TiB header ends the process; without the rate
// limit the garbage writes a line per message.
func TestKVEventAttacks(t *testing.T) {
	if !MemSupported {
		t.Skip("resident memory is read from /proc/<pid>/status: Linux only")
	}
	saved := kvSizes
	t.Cleanup(func() { kvSizes = saved })
	kvSizes.StreamBytes, kvSizes.Garbage = 256<<20, 20_000
	savedStrangers := kvStrangers
	t.Cleanup(func() { kvStrangers = savedStrangers })
	kvStrangers = 300
	e := testEnv(t)
	for _, a := range []struct {
		name string
		run  func(*env) (Result, error)
	}{
		{"kv-frame-huge", kvFrameHuge},
		{"kv-frame-stream", kvFrameStream},
		{"kv-garbage", kvGarbage},
		{"kv-listen-strangers", kvListenStrangers},
	} {
		t.Run(a.name, func(t *testing.T) {
			r, err := a.run(e)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: held=%v %s", a.name, r.Held, r.Figure)
			if !r.Held {
				t.Errorf("%s did not hold: %s", a.name, r.Figure)
			}
		})
	}
}
