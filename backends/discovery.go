package backends

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
)

// Resolver looks up the addresses of a host name. *net.Resolver implements it;
// tests substitute their own.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

// Expand turns specs into the replica list: a spec with Discover set names a
// DNS name (such as a Kubernetes headless service) and becomes one replica
// per address it resolves to, named "<name>-<address>", with the URL's base
// path and, for https, the DNS name as TLS server name unless the spec sets
// one; other specs are kept as they are. Then each spec of several
// data-parallel ranks becomes one replica per rank ([ExpandRanks]). The result is sorted by name
// within each discovered spec so that an unchanged answer yields an
// unchanged list. A name that fails to resolve yields an error and no
// replicas for that spec; the caller decides whether to keep the previous
// list.
func Expand(ctx context.Context, specs []Spec, r Resolver) ([]Spec, error) {
	out := make([]Spec, 0, len(specs))
	var firstErr error
	for _, s := range specs {
		if !s.Discover {
			out = append(out, s)
			continue
		}
		u, err := url.Parse(s.URL)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Name, err)
		}
		addrs, err := r.LookupHost(ctx, u.Hostname())
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("resolving %s for %s: %w", u.Hostname(), s.Name, err)
			}
			continue
		}
		// Sorted in a copy: the resolver may hand out a slice it keeps.
		addrs = slices.Compact(slices.Sorted(slices.Values(addrs)))
		port := u.Port()
		for _, a := range addrs {
			c := cloneSpec(s)
			c.Discover = false
			c.Name = s.Name + "-" + a
			host := a
			if port != "" {
				host = net.JoinHostPort(a, port)
			} else if net.ParseIP(a).To4() == nil {
				host = "[" + a + "]"
			}
			c.URL = u.Scheme + "://" + host + u.EscapedPath()
			if u.Scheme == "https" && c.TLS.ServerName == "" && net.ParseIP(u.Hostname()) == nil {
				// The certificate names the service, not each address.
				c.TLS.ServerName = u.Hostname()
			}
			out = append(out, c)
		}
	}
	return ExpandRanks(out), firstErr
}
