package proxy

// Watching returns the client watches running (watch.go).
func Watching() int64 { return watching.Load() }

// ShareTenants returns the tenants counted for the fair shares (share.go).
func ShareTenants(p *Proxy) int {
	p.flow.mu.Lock()
	defer p.flow.mu.Unlock()
	return len(p.flow.tenants)
}
