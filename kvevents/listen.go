package kvevents

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"
)

// A subscriber that listens (SubOptions.Bind) takes the connections of
// whoever reaches its address, so it admits them with care: a connection
// from an address SubOptions.AllowPeer refuses is closed before a byte is
// read; one that has not finished its ZMTP handshake within
// SubOptions.HandshakeTimeout is closed (zmq4 reads handshakes one at a
// time, so a silent peer would otherwise hold every later one back); and
// one publisher is followed at a time: the connection that completes its
// handshake last replaces the one before (an engine that restarted dials
// again while the old connection may linger unseen). Every connection is
// read through the same bounds as a dialed one (guard.go).

// DefaultHandshakeTimeout is SubOptions.HandshakeTimeout when it is 0.
const DefaultHandshakeTimeout = 5 * time.Second

// bindPolicy is how a listening socket's guard admits connections.
type bindPolicy struct {
	allow     func(netip.Addr) bool // nil admits every address
	handshake time.Duration
	// refuse is called for every connection turned away, with the peer's
	// address and why; it must not block.
	refuse func(peer, why string)
	// onPeer is called when a publisher's connection completes its
	// handshake (true) and when the publisher followed closes (false).
	onPeer func(up bool)
}

// guardListener admits the connections of a listening socket (see above).
type guardListener struct {
	net.Listener
	ctx context.Context // the socket's: it ends before the socket closes the listener
	g   *guard
}

// Accept returns the next admitted connection. zmq4 calls it in a loop
// that retries at once on an error until the socket's ctx ends, so an
// error is returned only once ctx has ended.
func (l *guardListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				<-l.ctx.Done()
				return nil, err
			}
			// Out of descriptors, or a connection reset before it was
			// accepted: try again a little later.
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-l.ctx.Done():
				t.Stop()
				return nil, err
			case <-t.C:
			}
			continue
		}
		b := l.g.bind
		if !admits(b.allow, c.RemoteAddr()) {
			_ = c.Close()
			b.refuse(c.RemoteAddr().String(), "address not allowed")
			continue
		}
		gc := l.g.track(c)
		timer := time.AfterFunc(b.handshake, func() {
			_ = gc.Close()
			b.refuse(c.RemoteAddr().String(), "no handshake in time")
		})
		gc.shook = func() {
			if timer.Stop() { // else the timer has closed it
				l.g.follow(gc)
			}
		}
		return gc, nil
	}
}

// admits reports whether allow admits the address addr.
func admits(allow func(netip.Addr) bool, addr net.Addr) bool {
	if allow == nil {
		return true
	}
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return false
	}
	a, ok := netip.AddrFromSlice(ta.IP)
	return ok && allow(a.Unmap())
}

// follow makes c the publisher followed, closing the one before.
func (g *guard) follow(c *guardConn) {
	g.mu.Lock()
	if c.closed {
		g.mu.Unlock()
		return
	}
	old := g.peer
	g.peer = c
	g.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	if g.bind.onPeer != nil {
		g.bind.onPeer(true)
	}
}
