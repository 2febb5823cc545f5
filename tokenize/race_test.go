//go:build race

package tokenize

// raceEnabled reports a -race build, where sync.Pool drops items at random.
const raceEnabled = true
