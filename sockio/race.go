//go:build race

package sockio

// raceEnabled: built with the race detector (see syscallRead).
const raceEnabled = true
