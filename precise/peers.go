package precise

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// peerFilter admits the publishers of a replica whose engine dials kvroute
// (Endpoint.Bind): the prefixes of Endpoint.AllowFrom, or without them
// the addresses the replica's URL host resolves to, looked up again (at
// most once per resolveEvery) when a peer is not among them, so that a
// replica that moved is admitted at its new address.
type peerFilter struct {
	prefixes []netip.Prefix
	host     string // the URL host to resolve; "" with prefixes

	mu       sync.Mutex
	addrs    []netip.Addr
	resolved time.Time
}

// resolveEvery bounds how often a refused peer makes the filter look the
// host up again.
const resolveEvery = 10 * time.Second

// resolveTimeout bounds one lookup.
const resolveTimeout = 2 * time.Second

// newPeerFilter returns the filter of a replica at replicaURL admitting
// allowFrom (comma-separated prefixes, as backends.KVEvents holds them).
func newPeerFilter(allowFrom, replicaURL string) *peerFilter {
	f := &peerFilter{}
	for s := range strings.SplitSeq(allowFrom, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			f.prefixes = append(f.prefixes, p)
		}
	}
	if len(f.prefixes) > 0 {
		return f
	}
	if u, err := url.Parse(replicaURL); err == nil {
		f.host = u.Hostname()
	}
	if a, err := netip.ParseAddr(f.host); err == nil {
		f.prefixes, f.host = []netip.Prefix{netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())}, ""
	}
	return f
}

// allow reports whether a publisher may connect from a.
func (f *peerFilter) allow(a netip.Addr) bool {
	if slices.ContainsFunc(f.prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
		return true
	}
	if f.host == "" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.addrs, a) && time.Since(f.resolved) >= resolveEvery {
		f.resolved = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", f.host)
		cancel()
		if err == nil {
			f.addrs = f.addrs[:0]
			for _, x := range addrs {
				f.addrs = append(f.addrs, x.Unmap())
			}
		}
	}
	return slices.Contains(f.addrs, a)
}
