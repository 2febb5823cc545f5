package precise

import (
	"net/netip"
	"testing"
)

// A listening replica admits the prefixes of its allow_from, or without
// them the addresses its URL's host names: an IP literal at once, a name
// once looked up.
func TestPeerFilter(t *testing.T) {
	cases := []struct {
		name, allowFrom, url string
		admit, refuse        []string
	}{
		{name: "prefixes", allowFrom: "10.0.0.0/8,192.168.1.5/32", url: "http://127.0.0.1:8000",
			admit: []string{"10.1.2.3", "192.168.1.5"}, refuse: []string{"127.0.0.1", "192.168.1.6", "::1"}},
		{name: "the url's address", url: "http://127.0.0.1:8000",
			admit: []string{"127.0.0.1"}, refuse: []string{"127.0.0.2", "::1", "10.0.0.1"}},
		{name: "the url's IPv6 address", url: "http://[::1]:8000",
			admit: []string{"::1"}, refuse: []string{"127.0.0.1"}},
		{name: "the url's name", url: "http://localhost:8000",
			admit: []string{"127.0.0.1"}, refuse: []string{"10.0.0.1"}},
		{name: "no host", url: "::bad",
			refuse: []string{"127.0.0.1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newPeerFilter(c.allowFrom, c.url)
			for _, a := range c.admit {
				if !f.allow(netip.MustParseAddr(a)) {
					t.Errorf("%s refused", a)
				}
			}
			for _, a := range c.refuse {
				if f.allow(netip.MustParseAddr(a)) {
					t.Errorf("%s admitted", a)
				}
			}
		})
	}
}
