package loopback

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
)

// FreeAddrs gives distinct 127.0.0.1 addresses below the ephemeral range
// that a listener can then take.
func TestFreeAddrs(t *testing.T) {
	addrs, err := FreeAddrs(3)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] || !strings.HasPrefix(a, "127.0.0.1:") {
			t.Fatalf("addresses %v: want three distinct 127.0.0.1 ones", addrs)
		}
		seen[a] = true
		if port, _ := strconv.Atoi(a[len("127.0.0.1:"):]); port < freeLow || port >= freeHigh {
			t.Fatalf("address %s: want a port in [%d, %d)", a, freeLow, freeHigh)
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(context.Background(), "tcp", a)
		if err != nil {
			t.Fatalf("listen on %s: %v", a, err)
		}
		_ = ln.Close()
	}
}
