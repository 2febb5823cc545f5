//go:build race

// Package race tells tests whether the race detector is on: in a -race
// build sync.Pool drops items at random, so allocation budgets that rely on
// pooled buffers do not hold there.
package race

// Enabled reports a -race build.
const Enabled = true
