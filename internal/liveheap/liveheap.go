// Package liveheap measures the live heap for tests: what a structure
// keeps, as opposed to what it allocated on the way. It imports nothing of
// kvroute, so every package's tests may use it.
package liveheap

import "runtime"

// Bytes returns the live heap after a full collection (two, so that
// objects freed by the first one's cleanups are gone too).
func Bytes() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// PerEntry returns the live heap that fill adds, divided by n: the bytes
// an entry takes when fill stores n entries. What fill stores must stay
// reachable until PerEntry returns, and so must its inputs, or their
// freeing is subtracted.
func PerEntry(n int, fill func()) float64 {
	before := Bytes()
	fill()
	return (float64(Bytes()) - float64(before)) / float64(n)
}
