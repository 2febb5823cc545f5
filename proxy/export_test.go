package proxy

// Watching returns the client watches running (watch.go).
func Watching() int64 { return watching.Load() }
