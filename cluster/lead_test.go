package cluster

import (
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
)

// reservedOn counts m's reservations as the leader on replica name.
func (m *member) reservedOn(name string) int64 {
	m.node.inMu.Lock()
	defer m.node.inMu.Unlock()
	return m.node.reservedOn[name]
}

func (m *member) reservations() int {
	m.node.inMu.Lock()
	defer m.node.inMu.Unlock()
	return len(m.node.reserved)
}

// startThree starts members a, b and c (a the seed) and waits until each
// hears the other two.
func startThree(t *testing.T, edit func(id string, c *config.Cluster)) (a, b, c *member) {
	t.Helper()
	conf := func(id string, peers ...string) config.Cluster {
		c := testConfig(id, peers...)
		c.LeadTimeout = time.Second // generous: the race detector on a busy machine
		if edit != nil {
			edit(id, &c)
		}
		return c
	}
	a = startMember(t, conf("a"))
	b = startMember(t, conf("b", a.node.ClusterAddr()))
	c = startMember(t, conf("c", a.node.ClusterAddr()))
	wait.For(t, 10*time.Second, "each to hear the other two", func() bool {
		return a.node.Stats().Peers == 2 && b.node.Stats().Peers == 2 && c.node.Stats().Peers == 2
	})
	return a, b, c
}

// The live member of the lowest id leads, whoever asks; it answers for
// itself at once, without a message.
func TestLeaderIsLowestLiveID(t *testing.T) {
	a, b, c := startThree(t, nil)
	for _, m := range []*member{a, b, c} {
		if got := m.node.leaderID(); got != "a" {
			t.Errorf("%s: leader %q, want a", m.node.ID(), got)
		}
	}
	if l := a.node.Coordinate("m", key(1, 4), 64); !l.Self {
		t.Errorf("the leader's own Coordinate = %+v, want Self", l)
	}
	if st := a.node.Stats(); !st.Leading || st.LeadAsked != 0 {
		t.Errorf("a's stats %+v: want leading, nothing asked", st)
	}
	if b.node.Stats().Leading {
		t.Error("b says it leads")
	}
}

// A request placed on load at one member goes where the leader says. The
// leader counts its choice in flight and pending at once, so that two asks
// in a row spread as one router would place them; each asker's placement,
// naming the ticket, replaces the reservation.
func TestLeaderChoosesAndPlacementReleases(t *testing.T) {
	a, b, c := startThree(t, nil)
	k1, k2 := key(11, 64), key(12, 64)
	l1 := b.node.Coordinate("m", k1, 64*16)
	l2 := c.node.Coordinate("m", k2, 64*16)
	if l1.Replica == "" || l2.Replica == "" || l1.Ticket == 0 || l2.Ticket == 0 {
		t.Fatalf("answers %+v and %+v, want replicas and tickets", l1, l2)
	}
	if l1.Replica == l2.Replica {
		t.Errorf("two cold requests of 1024 tokens on an idle fleet both went to %s", l1.Replica)
	}
	r1 := a.replica(l1.Replica)
	if a.reservedOn(l1.Replica) != 1 || r1.PeerInFlight() != 1 || a.pending(r1) != 64*16 {
		t.Errorf("leader's view of %s: %d reserved, %d peer in flight, %d pending; want 1, 1, 1024",
			l1.Replica, a.reservedOn(l1.Replica), r1.PeerInFlight(), a.pending(r1))
	}
	if a.holds(k1, l1.Replica) == 0 {
		t.Error("the reservation is not in the leader's Index")
	}
	b.place(t, l1.Replica, k1, 64*16, l1.Ticket)
	wait.For(t, 10*time.Second, "b's placement to replace the reservation", func() bool { return a.reservedOn(l1.Replica) == 0 })
	// Now counted once, as b's.
	wait.For(t, 10*time.Second, "b's placement in flight", func() bool { return r1.PeerInFlight() == 1 })
	if p := a.pending(r1); p != 64*16 {
		t.Errorf("pending on %s after the placement: %d, want 1024 (b's only)", l1.Replica, p)
	}
	if a.holds(k1, l1.Replica) == 0 {
		t.Error("b's placement is not in the leader's Index")
	}
	if st := b.node.Stats(); st.LeadAsked != 1 || st.LeadMissed != 0 {
		t.Errorf("b's stats %+v: want 1 asked, 0 missed", st)
	}
	if st := a.node.Stats(); st.LeadServed != 2 {
		t.Errorf("a served %d asks, want 2", st.LeadServed)
	}
	if w := b.node.LeadWait(); w.Count != 1 {
		t.Errorf("b's lead wait counted %d asks, want 1", w.Count)
	}
}

// An answer past lead_timeout is not waited for: the asker chooses alone
// and cancels the ask, which takes the leader's reservation back well
// before it would lapse.
func TestLateAnswerIsCanceled(t *testing.T) {
	a, b, _ := startThree(t, func(id string, c *config.Cluster) {
		if id == "b" {
			c.LeadTimeout = 50 * time.Millisecond
		}
	})
	k := key(13, 8)
	// The leader answers late: its answer (and b's cancel) wait for the
	// lock held here until b's ask is past its deadline.
	a.node.inMu.Lock()
	l := b.node.Coordinate("m", k, 128)
	a.node.inMu.Unlock()
	if l.Replica != "" || l.Self {
		t.Fatalf("an ask past its deadline answered %+v", l)
	}
	wait.For(t, 10*time.Second, "the leader to answer the late ask", func() bool { return a.node.Stats().LeadServed == 1 })
	wait.For(t, reserveLife/2, "the cancel to take the reservation back", func() bool { return a.reservations() == 0 })
	if st := a.node.Stats(); st.LeadLapsed != 0 {
		t.Errorf("%d reservations lapsed, want 0 (canceled)", st.LeadLapsed)
	}
	if st := b.node.Stats(); st.LeadMissed != 1 {
		t.Errorf("b missed %d answers, want 1", st.LeadMissed)
	}
}

// A reservation no placement names lapses.
func TestUnclaimedReservationLapses(t *testing.T) {
	a, b, _ := startThree(t, nil)
	l := b.node.Coordinate("m", key(14, 8), 128)
	if l.Replica == "" {
		t.Fatalf("no answer: %+v", l)
	}
	rep := a.replica(l.Replica)
	wait.For(t, 10*time.Second, "the reservation to lapse", func() bool {
		return a.reservations() == 0 && a.node.Stats().LeadLapsed == 1
	})
	wait.For(t, 10*time.Second, "its load to go", func() bool { return rep.PeerInFlight() == 0 && a.pending(rep) == 0 })
}

// With the leader gone, the others choose alone at once (no responders),
// then the next lowest id leads.
func TestLeaderGone(t *testing.T) {
	a, b, c := startThree(t, nil)
	a.stop()
	<-a.node.Done()
	l := b.node.Coordinate("m", key(15, 8), 128)
	if l.Replica != "" || l.Self {
		t.Errorf("with the leader stopped, Coordinate = %+v, want no choice", l)
	}
	wait.For(t, 20*time.Second, "b to lead", func() bool { return b.node.leaderID() == "b" && c.node.leaderID() == "b" })
	if l := b.node.Coordinate("m", key(16, 8), 128); !l.Self {
		t.Errorf("the new leader's Coordinate = %+v, want Self", l)
	}
	wait.For(t, 10*time.Second, "c's leader down mark to pass", func() bool {
		return time.Now().UnixNano() >= c.node.leadDown.Load()
	})
	if l := c.node.Coordinate("m", key(17, 8), 128); l.Replica == "" {
		t.Errorf("c's ask of the new leader: %+v", l)
	}
}

// Alone, an instance has no leader: it places as the one router.
func TestNoPeersNoLeader(t *testing.T) {
	m := startMember(t, testConfig("a"))
	if l := m.node.Coordinate("m", key(18, 8), 128); l != (router.Lead{}) {
		t.Errorf("alone, Coordinate = %+v, want none", l)
	}
}

func TestLeadWire(t *testing.T) {
	a := ask{ticket: 77, model: "m", tokens: 4096, key: key(19, 5)}
	got, err := openAsk(testSeal.seal(encodeAsk(a)))
	if err != nil || !reflect.DeepEqual(got, a) {
		t.Errorf("ask round trip: %+v, %v; want %+v", got, err, a)
	}
	ticket, rep, err := decodeAnswer(testSeal.seal(encodeAnswer(77, "e2"))[3+macLen:])
	if err != nil || ticket != 77 || rep != "e2" {
		t.Errorf("answer round trip: %d %q %v", ticket, rep, err)
	}
	good := testSeal.seal(encodeAsk(a))
	for name, b := range map[string][]byte{
		"empty":       nil,
		"magic":       append([]byte("kr"), good[2:]...),
		"version":     append([]byte{'k', 'l', 9}, good[3:]...),
		"truncated":   testSeal.seal(encodeAsk(a)[:len(good)-1]),
		"trailing":    testSeal.seal(append(encodeAsk(a), 0)),
		"no ticket":   testSeal.seal(encodeAsk(ask{model: "m"})),
		"unsealed":    encodeAsk(a),
		"another key": newSealer([]byte("another")).seal(encodeAsk(a)),
	} {
		if _, err := openAsk(b); err == nil {
			t.Errorf("%s ask: decoded", name)
		}
	}
}

// FuzzDecodeLead: no ask or answer panics its decoder, and a decoded ask
// re-encodes to the same bytes.
func FuzzDecodeLead(f *testing.F) {
	f.Add(encodeAsk(ask{ticket: 1, model: "m", tokens: 10, key: key(1, 3)})[3+macLen:])
	f.Add(encodeAnswer(5, "e1")[3+macLen:])
	f.Add([]byte("kl\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = openAsk(b)
		_, _, _ = decodeAnswer(b)
		a, err := decodeAsk(b)
		if err != nil {
			return
		}
		a2, err := decodeAsk(encodeAsk(a)[3+macLen:])
		if err != nil || !reflect.DeepEqual(a2, a) {
			t.Fatalf("re-encoded ask decoded as %+v, %v; want %+v", a2, err, a)
		}
	})
}

// BenchmarkCoordinate is one ask of the leader and its answer, between two
// members joined by a route on 127.0.0.1: what a request placed on load
// waits for with peers.
func BenchmarkCoordinate(b *testing.B) {
	la := startMember(b, testConfig("a"))
	cb := testConfig("b", la.node.ClusterAddr())
	cb.LeadTimeout = time.Second
	lb := startMember(b, cb)
	wait.For(b, 10*time.Second, "each to hear the other", func() bool { return la.node.Stats().Peers == 1 && lb.node.Stats().Peers == 1 })
	k := key(20, 256)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l := lb.node.Coordinate("m", k, 4096)
		if l.Replica == "" {
			b.Fatal("no answer")
		}
		lb.node.add(&record{kind: recCancel, ticket: l.Ticket}, false)
	}
}

// A cancel that arrives before its ask (batches and asks come on
// subscriptions of their own) still keeps the leader from reserving.
func TestCancelBeforeAsk(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	f.answerResyncs()
	const ticket = 991
	f.send(1, record{kind: recCancel, ticket: ticket})
	wait.For(t, 10*time.Second, "the cancel to be applied", func() bool {
		m.node.inMu.Lock()
		defer m.node.inMu.Unlock()
		_, ok := m.node.canceled[ticket]
		return ok
	})
	reply, err := f.nc.Request("kvroute.t.lead.a", testSeal.seal(encodeAsk(ask{ticket: ticket, model: "m", tokens: 128, key: key(21, 8)})), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	body, err := testSeal.open(reply.Data, leadMagic1, leadVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := decodeAnswer(body); err != nil || got != ticket {
		t.Fatalf("answer for ticket %d, %v; want %d", got, err, ticket)
	}
	if n := m.reservations(); n != 0 {
		t.Errorf("%d reservations for a canceled ask, want 0", n)
	}
	for _, r := range m.fleet.Replicas() {
		if r.PeerInFlight() != 0 || m.pending(r) != 0 {
			t.Errorf("%s: %d in flight, %d pending after a canceled ask", r.Name(), r.PeerInFlight(), m.pending(r))
		}
	}
}

// openAsk opens an ask sealed as testConfig's members seal, and decodes it.
func openAsk(b []byte) (ask, error) {
	body, err := testSeal.open(b, leadMagic1, leadVersion)
	if err != nil {
		return ask{}, err
	}
	return decodeAsk(body)
}
