package proxy

// Watching returns the client watches running (watch.go).
func Watching() int64 { return watching.Load() }

// ShareTenants returns the tenants counted for the fair shares (share.go).
func ShareTenants(p *Proxy) int {
	p.flow.mu.Lock()
	defer p.flow.mu.Unlock()
	return len(p.flow.tenants)
}

// SplitReuse is splitReuse (reuse.go).
func SplitReuse(prompt, cached, matched, best int) Reuse {
	return splitReuse(prompt, cached, matched, best)
}

// ReuseObserver is reuseObserver.
type ReuseObserver = reuseObserver
