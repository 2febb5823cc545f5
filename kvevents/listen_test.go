package kvevents

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/internal/wait"
)

// listenAddr is a free 127.0.0.1 address for a listening subscriber, as
// "tcp://host:port" and as "host:port".
func listenAddr(t *testing.T) (endpoint, hostPort string) {
	t.Helper()
	a, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return "tcp://" + a, a
}

// listening subscribes with Bind on a free address and waits until the
// socket listens.
func listening(t *testing.T, o SubOptions) (*Subscriber, *recorder, string) {
	t.Helper()
	ep, hp := listenAddr(t)
	o.Endpoint, o.Bind = ep, true
	s, h := subscribe(t, nil, o)
	wait.For(t, 5*time.Second, "the socket to listen", func() bool { return s.Status().Listening })
	return s, h, hp
}

// dialingPub is a publisher that connects to a listening subscriber, as
// vLLM's does when its endpoint names a host.
func dialingPub(t *testing.T, endpoint string) *Publisher {
	t.Helper()
	return newPub(t, PubOptions{Endpoint: endpoint, Connect: true})
}

// A listening subscriber follows the publisher that dials it: batches are
// delivered, it is live while the publisher is connected and not after.
func TestBindFollowsADialingPublisher(t *testing.T) {
	s, h, hp := listening(t, SubOptions{})
	if st := s.Status(); st.Live || st.Connects != 0 {
		t.Fatalf("live before a publisher connected: %+v", st)
	}
	p := dialingPub(t, "tcp://"+hp)
	ts := warmUp(t, p, s)
	n := len(h.snapshot())
	publish(t, p, false, ts, ts+1)
	wait.For(t, 5*time.Second, "two more batches", func() bool { return len(h.snapshot()) == n+2 })
	if st := s.Status(); !st.Live || st.Connects != 1 || st.Resets != 0 {
		t.Fatalf("status %+v", st)
	}
	_ = p.Close()
	wait.For(t, 5*time.Second, "not live once the publisher left", func() bool { return !s.Status().Live })
}

// A connection from an address the subscriber does not allow is closed
// before anything of it is read and counted; the socket goes on listening,
// and a publisher it allows is followed.
func TestBindRefusesAddressesNotAllowed(t *testing.T) {
	var open atomic.Bool
	allow := func(a netip.Addr) bool { return open.Load() && a == netip.MustParseAddr("127.0.0.1") }
	s, h, hp := listening(t, SubOptions{AllowPeer: allow})
	stranger, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", hp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stranger.Close() }()
	_, _ = stranger.Write(append(ZMTPHandshake("PUB"), goodMsg(t, 0)...))
	wait.For(t, 5*time.Second, "a refusal", func() bool { return s.Status().Rejected[PeerRefused] == 1 })
	_ = stranger.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := stranger.Read(make([]byte, 64)); err == nil || n > 0 {
		t.Fatalf("the refused connection read %d bytes of a greeting (%v)", n, err)
	}
	if st := s.Status(); st.Batches != 0 || st.Live || st.Connects != 0 {
		t.Fatalf("the stranger got through: %+v (handler saw %v)", st, h.snapshot())
	}
	open.Store(true)
	p := dialingPub(t, "tcp://"+hp)
	warmUp(t, p, s)
	if st := s.Status(); !st.Live || st.Connects != 1 {
		t.Fatalf("status %+v", st)
	}
}

// A peer that connects and says nothing is closed once the handshake
// timeout has passed: zmq4 reads one handshake at a time, so without it
// the publisher behind the silent peer would never be heard.
func TestBindSilentPeerDoesNotHoldThePublisherBack(t *testing.T) {
	s, _, hp := listening(t, SubOptions{HandshakeTimeout: 200 * time.Millisecond})
	silent, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", hp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	p := dialingPub(t, "tcp://"+hp)
	warmUp(t, p, s)
	if st := s.Status(); st.Rejected[PeerRefused] != 1 || st.Connects != 1 {
		t.Fatalf("status %+v, want one refusal (the silent peer) and one publisher", st)
	}
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 128)); err == nil {
		for { // the subscriber's greeting, then the close
			if _, err = silent.Read(make([]byte, 128)); err != nil {
				break
			}
		}
	}
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the silent peer's connection is still open")
	}
}

// A publisher that dials again (an engine restarted while its old
// connection lingers) replaces the one followed: the first one's
// connection is closed, and its batches are not delivered.
func TestBindNewestPublisherIsFollowed(t *testing.T) {
	s, h, hp := listening(t, SubOptions{})
	first := dialingPub(t, "tcp://"+hp)
	warmUp(t, first, s)
	second := dialingPub(t, "tcp://"+hp)
	wait.For(t, 5*time.Second, "the second publisher", func() bool { return s.Status().Connects == 2 })
	n := len(h.snapshot())
	for i := range 20 {
		publish(t, first, false, float64(1000+i))
	}
	ts := 2000.0
	wait.For(t, 5*time.Second, "the second publisher's batches", func() bool {
		publish(t, second, false, ts)
		ts++
		time.Sleep(5 * time.Millisecond)
		return strings.Contains(strings.Join(h.since(n), " "), "b2000")
	})
	for _, e := range h.since(n) {
		if strings.HasPrefix(e, "b1") && len(e) == 5 {
			t.Fatalf("a batch of the replaced publisher was delivered: %v", h.since(n))
		}
	}
}

// A dialing peer that declares a frame past the bound is closed as a dialed
// one is, the process keeps its memory, and a publisher that dials next is
// followed.
func TestBindGuardsWhatPeersSend(t *testing.T) {
	s, _, hp := listening(t, SubOptions{MaxEventBytes: 1 << 20})
	c, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", hp)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write(append(ZMTPHandshake("PUB"), AppendZMTPHeader(nil, 0, 1<<40)...)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, "the rejection", func() bool { return s.Status().Rejected[FrameTooLarge] == 1 })
	wait.For(t, 5*time.Second, "listening again", func() bool { return s.Status().Listening })
	p := dialingPub(t, "tcp://"+hp)
	warmUp(t, p, s)
}
