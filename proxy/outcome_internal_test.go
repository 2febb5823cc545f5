package proxy

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/internal/loopback"
	"github.com/kvroute/kvroute/internal/race"
)

// The access log's method is a constant for a forwarded method and a
// copy, cut to maxLogField, for any other; building it for a forwarded one
// allocates nothing.
func TestMethodString(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"POST", "POST"}, {"GET", "GET"}, {"OPTIONS", "OPTIONS"},
		{"post", "post"}, {"BREW", "BREW"}, {"", ""},
	} {
		if got := methodString([]byte(c.in)); got != c.want {
			t.Errorf("methodString(%q) = %q", c.in, got)
		}
	}
	long := make([]byte, 2*maxLogField)
	if got := methodString(long); len(got) != maxLogField {
		t.Errorf("a %d-byte method logged as %d bytes", len(long), len(got))
	}
	post := []byte("POST")
	if n := testing.AllocsPerRun(100, func() { _ = methodString(post) }); n != 0 && !race.Enabled {
		t.Errorf("methodString(POST): %.0f allocations", n)
	}
}

// The access log's client address: the one a counted connection worked
// out at its accept, else the request's remote address; both as the net
// package writes it.
func TestClientAddr(t *testing.T) {
	c, _ := loopback.Pair(t)
	var open atomic.Int64
	var ctx fasthttp.RequestCtx
	ctx.Init2(countConn(c, &open), nil, false)
	if got, want := clientAddr(&ctx), c.RemoteAddr().String(); got != want {
		t.Errorf("through a counted connection: %q, want %q", got, want)
	}
	if got, want := clientIP(&ctx), ctx.RemoteIP().String(); got != want {
		t.Errorf("IP through a counted connection: %q, want %q", got, want)
	}
	var bare fasthttp.RequestCtx
	addr := &net.TCPAddr{IP: net.IPv6loopback, Port: 443}
	bare.Init(&fasthttp.Request{}, addr, nil)
	if got := clientAddr(&bare); got != "[::1]:443" {
		t.Errorf("without one: %q, want [::1]:443", got)
	}
	if got := clientIP(&bare); got != "::1" {
		t.Errorf("IP without one: %q, want ::1", got)
	}
}
