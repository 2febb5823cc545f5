//go:build kvroute_nopoller

package sockio

// pollers: see poll_on.go.
const pollers = false
