//go:build kvroute_noraw

package sockio

// rawCalls: see layers_on.go.
const rawCalls = false
