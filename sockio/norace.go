//go:build !race

package sockio

// Without the race detector there is nothing to tell (see race.go).

func raceRelease(uintptr) {}

func raceAcquire(uintptr) {}
