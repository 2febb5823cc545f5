package cluster

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/internal/wait"
)

// publishAs publishes a live batch of recs from sender, sealed by s.
func publishAs(t *testing.T, nc *nats.Conn, s *sealer, sender string, seq uint64, recs ...record) {
	t.Helper()
	b := appendHeader(nil, header{sender: sender, epoch: 1, seq: seq, base: time.Now().UnixMicro()})
	for i := range recs {
		b = appendRecord(b, &recs[i], time.Now().UnixMicro())
	}
	if err := nc.Publish("kvroute.t.d."+sender, s.seal(b)); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// A batch not sealed under the cluster's key (a client of a shared NATS
// without the token) is dropped and counted: its sender neither joins nor
// leads, its load does not count.
func TestNonMemberDropped(t *testing.T) {
	m := startMember(t, testConfig("b"))
	f := newFakePeer(t, m)
	stranger := newSealer([]byte("a guess"))
	for seq := uint64(1); seq <= 5; seq++ {
		publishAs(t, f.nc, stranger, "a", seq, record{kind: recLoad, replica: "e1", inflight: 50})
	}
	wait.For(t, 10*time.Second, "the batches to be dropped", func() bool { return m.node.Stats().Rejected["unauthenticated"] == 5 })
	if st := m.node.Stats(); st.Peers != 0 || m.replica("e1").PeerInFlight() != 0 || m.node.leaderID() != "" {
		t.Errorf("a stranger's batches count: peers %d, e1 in flight %d, leader %q", st.Peers, m.replica("e1").PeerInFlight(), m.node.leaderID())
	}
}

// Past cluster.max_peers a new sender is ignored and counted, and asks for
// no resync.
func TestMaxPeersBound(t *testing.T) {
	c := testConfig("a")
	c.MaxPeers = 3
	m := startMember(t, c)
	f := newFakePeer(t, m)
	for i := range 40 {
		publishAs(t, f.nc, testSeal, "p"+strconv.Itoa(i), 1, record{kind: recLoad, replica: "e0", inflight: 0})
	}
	wait.For(t, 10*time.Second, "the senders past the bound to be ignored", func() bool { return m.node.Stats().Rejected["max_peers"] == 37 })
	if st := m.node.Stats(); st.Peers != 3 || st.Resyncs != 3 {
		t.Errorf("peers %d, resyncs %d; want 3 and 3", st.Peers, st.Resyncs)
	}
}

// A peer's placements are held up to cluster.max_peer_placement_bytes,
// its oldest dropped past it; what one costs is within placeCost.
func TestPlacementBytesBound(t *testing.T) {
	c := testConfig("a")
	const held = 2000
	c.MaxPeerPlacementBytes = held * placeCost(key(0, 8), nil)
	m := startMember(t, c)
	f := newFakePeer(t, m)
	f.answerResyncs()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const sent = 10000
	for b := range sent / 500 {
		recs := make([]record, 500)
		for i := range recs {
			id := uint64(b*500 + i + 1)
			recs[i] = record{kind: recPlace, id: id, at: time.Now().UnixMicro(), replica: "e0", model: "m", key: key(uint32(id), 8)}
		}
		f.send(uint64(b+1), recs...)
	}
	wait.For(t, 10*time.Second, "the oldest to be dropped", func() bool { return m.node.Stats().Rejected["placements"] == sent-held })
	m.node.inMu.Lock()
	p := m.node.peers["fake"]
	n, bytesHeld := p.places.Len(), p.places.Cost()
	oldest := p.places.Peek(1) != nil
	newest := p.places.Peek(sent) != nil
	m.node.inMu.Unlock()
	if n != held || bytesHeld > c.MaxPeerPlacementBytes || oldest || !newest {
		t.Errorf("held %d placements of %d bytes (oldest %v, newest %v); want %d within %d, the newest", n, bytesHeld, oldest, newest, held, c.MaxPeerPlacementBytes)
	}
	// What the placements took, their Index entries included (all sent
	// entered the Index, which tree_max_bytes bounds apart).
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap +%d bytes for %d placements sent, %d held: %d bytes per sent one; a held one counted %d", grown, sent, held, grown/sent, placeCost(key(0, 8), nil))
}

// The peers' claimed load on a replica is held to what its engine reports
// running and waiting (fresh metrics), plus their placements since.
func TestLoadClaimBound(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	f.answerResyncs()
	e1 := m.replica("e1")
	e1.Observe(backends.Snapshot{At: time.Now().Add(time.Hour), Running: 2, Waiting: 1})
	f.send(1, record{kind: recLoad, replica: "e1", inflight: 1000, pending: 1 << 30})
	// The cut is counted before the cut load is applied: wait for both.
	wait.For(t, 10*time.Second, "the claim to be cut to the engine's 3", func() bool {
		return m.node.Stats().Rejected["load"] > 0 && e1.PeerInFlight() == 3
	})
	if p := m.pending(e1); p > (1<<30)*3/1000+1 {
		t.Errorf("pending %d, want it cut in the claim's proportion", p)
	}
}

// Session IDs and response ids cross the wire as digests only, which the
// peer applies as they come.
func TestIDsCrossAsDigests(t *testing.T) {
	a := startMember(t, testConfig("a"))
	b := startMember(t, testConfig("b", a.node.ClusterAddr()))
	wait.For(t, 10*time.Second, "each to hear the other", func() bool { return a.node.Stats().Peers == 1 && b.node.Stats().Peers == 1 })
	spy := newFakePeer(t, a)
	leaked := make(chan string, 4)
	if _, err := spy.nc.Subscribe("kvroute.>", func(msg *nats.Msg) {
		for _, s := range []string{"secret-session-7", "resp_secret_9"} {
			if bytes.Contains(msg.Data, []byte(s)) {
				leaked <- s
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	a.node.Bound("secret-session-7", a.replica("e2"), time.Now())
	a.rt.Responses().Record("resp_secret_9", a.replica("e3"))
	wait.For(t, 10*time.Second, "b to learn both", func() bool {
		return b.rt.Sessions().Lookup("secret-session-7", time.Now()) == b.replica("e2") && b.rt.Responses().Lookup("resp_secret_9") == b.replica("e3")
	})
	select {
	case s := <-leaked:
		t.Errorf("%q crossed the wire whole", s)
	default:
	}
}

// A resync request not sealed by a member is not answered; one from an
// asker whose resync is being answered is refused.
func TestResyncOnlyToMembers(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	m.place(t, "e0", key(1, 4), 10, 0)
	if _, err := f.nc.Request("kvroute.t.sync.a", newSealer([]byte("a guess")).seal(encodeSync("x", []seqRange{{0, 10}})), 500*time.Millisecond); err == nil {
		t.Error("an unsealed resync request was answered")
	}
	if _, err := f.nc.Request("kvroute.t.sync.a", testSeal.seal(encodeSync("x", []seqRange{{0, 10}})), 5*time.Second); err != nil {
		t.Errorf("a member's resync request: %v", err)
	}
	m.node.inMu.Lock()
	m.node.replaying["y"] = true
	m.node.inMu.Unlock()
	if _, err := f.nc.Request("kvroute.t.sync.a", testSeal.seal(encodeSync("y", []seqRange{{0, 10}})), 500*time.Millisecond); err == nil {
		t.Error("a second resync of the same asker was answered while the first was")
	}
	if st := m.node.Stats(); st.Rejected["unauthenticated"] != 1 || st.Rejected["resync_busy"] != 1 {
		t.Errorf("rejected %v, want one unauthenticated and one resync_busy", st.Rejected)
	}
}
