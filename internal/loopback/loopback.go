// Package loopback gives tests both ends of a real TCP connection on
// 127.0.0.1. Free addresses for the processes tests and benchmarks start
// are bench/loopback's.
package loopback

import (
	"net"
	"testing"
)

// Pair returns both ends of a TCP connection on 127.0.0.1, closed when the
// test ends.
func Pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = (&net.Dialer{}).DialContext(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _, _ = client.Close(), server.Close() })
	return client, server
}
