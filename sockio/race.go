//go:build race

package sockio

import "sync/atomic"

// raceIO orders, for the race detector, every socket write before every
// later socket read: a write adds to it, a read loads it after its call,
// and atomics are synchronizing operations to the detector.
var raceIO atomic.Uint64

func raceRelease() { raceIO.Add(1) }

func raceAcquire() { raceIO.Load() }
