// Package loopback picks free 127.0.0.1 addresses for the processes the
// benchmarks (and the tests that start a kvroute process) tell where to
// listen.
package loopback

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// Ports FreeAddrs picks from: below 32768, where Linux starts the
// ephemeral range its outgoing connections take their local ports from,
// so that a port found free stays free until the process told to listen
// on it does so.
const (
	freeLow  = 20000
	freeHigh = 32768
)

// freeTries bounds the ports FreeAddrs tries for each address.
const freeTries = 200

// FreeAddrs returns n distinct 127.0.0.1 addresses, each free a moment
// ago, for child processes that must be told where to listen (a listener
// and an admin listener, say): each port is below the ephemeral range and
// held until all are picked.
func FreeAddrs(n int) ([]string, error) {
	var lc net.ListenConfig
	addrs := make([]string, 0, n)
	for range n {
		var ln net.Listener
		var err error
		for range freeTries {
			port := freeLow + rand.IntN(freeHigh-freeLow) //nolint:gosec // a port, not a secret
			if ln, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				break
			}
		}
		if ln == nil {
			return nil, fmt.Errorf("no free 127.0.0.1 port in [%d, %d) after %d tries: %w", freeLow, freeHigh, freeTries, err)
		}
		defer func() { _ = ln.Close() }()
		addrs = append(addrs, ln.Addr().String())
	}
	return addrs, nil
}

// FreeAddr is one address of FreeAddrs.
func FreeAddr() (string, error) {
	a, err := FreeAddrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}
