package cluster

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/testca"
	"github.com/kvroute/kvroute/router"
)

// member is a Node over a router of its own, in front of a fleet of
// replica specs that are never contacted.
type member struct {
	node  *Node
	rt    *router.Router
	fleet *backends.Fleet
	stop  context.CancelFunc
}

func testFleet(t testing.TB, n int) *backends.Fleet {
	t.Helper()
	var specs []backends.Spec
	for i := 0; i < n; i++ {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("e%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 9+i), Engine: backends.EngineVLLM, Models: []string{"m"}})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func testConfig(id string, peers ...string) config.Cluster {
	return config.Cluster{Enabled: true, Name: "t", ID: id, Listen: "127.0.0.1:0", Peers: peers, Token: "test-token-0123",
		BatchInterval: time.Millisecond, LoadInterval: 50 * time.Millisecond, JournalBytes: 1 << 20,
		MaxPeers: 16, MaxPeerPlacementBytes: 8 << 20}
}

func startMember(t testing.TB, c config.Cluster) *member {
	t.Helper()
	fleet := testFleet(t, 4)
	ix := index.New(index.Options{KeyBlock: 16})
	rt, err := router.NewNamed(fleet, router.CacheAwareName, router.Deps{Index: ix, Sessions: router.NewSessions(time.Minute)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rt.SetResponses(router.NewResponses(time.Minute, 100))
	// As a server sets it: a prompt matching less than 256 tokens is cold.
	if err := rt.Configs().Set(router.CacheAwareName, &router.CacheAwareConfig{Lambda: 2048, Mu: 4096, Epsilon: 0.25, MinMatchTokens: 256,
		BranchBalance: 1.25}); err != nil {
		t.Fatal(err)
	}
	ix.SetTTL(time.Minute)
	ix.SetBlockSize(16)
	n, err := New(Options{Config: c, Fleet: fleet, Router: rt, Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := n.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	m := &member{node: n, rt: rt, fleet: fleet, stop: cancel}
	t.Cleanup(func() { cancel(); <-n.Done() })
	return m
}

// fakePeer speaks the batch format over a connection to m's embedded
// server, as another instance would.
type fakePeer struct {
	t     *testing.T
	id    string
	epoch atomic.Uint64 // of its start: restart changes it
	nc    *nats.Conn
	sub   string

	mu     sync.Mutex
	sent   map[uint64][]record // the live batches sent, by sequence
	ranges []seqRange          // the last resync request's
}

func newFakePeer(t *testing.T, m *member) *fakePeer {
	const id = "fake"
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(m.node.embed.ns), nats.Token(m.node.embed.token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	f := &fakePeer{t: t, id: id, nc: nc, sub: "kvroute.t.d." + id, sent: map[uint64][]record{}}
	f.epoch.Store(1)
	return f
}

// send publishes a live batch of recs with sequence seq.
func (f *fakePeer) send(seq uint64, recs ...record) {
	f.t.Helper()
	f.mu.Lock()
	f.sent[seq] = recs
	f.mu.Unlock()
	if err := f.nc.Publish(f.sub, encode(header{sender: f.id, epoch: f.epoch.Load(), seq: seq, base: time.Now().UnixMicro()}, recs)); err != nil {
		f.t.Fatal(err)
	}
	if err := f.nc.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

// answerResyncs replies to every resync request as an instance would, with
// one last chunk: the records of the batches asked for among those sent,
// and recs as batch 0's. It counts the requests; lastRanges is the last
// one's.
func (f *fakePeer) answerResyncs(recs ...record) *atomic.Int64 {
	var n atomic.Int64
	f.mu.Lock()
	f.sent[0] = recs
	f.mu.Unlock()
	_, err := f.nc.Subscribe("kvroute.t.sync."+f.id, func(msg *nats.Msg) {
		ranges, err := openSync(msg.Data)
		if err != nil {
			f.t.Errorf("resync request %x: %v", msg.Data, err)
			return
		}
		f.mu.Lock()
		f.ranges = ranges
		var out []record
		for _, seq := range slices.Sorted(maps.Keys(f.sent)) {
			if slices.ContainsFunc(ranges, func(r seqRange) bool { return r.holds(seq) }) {
				out = append(out, f.sent[seq]...)
			}
		}
		f.mu.Unlock()
		n.Add(1)
		_ = f.nc.Publish(msg.Reply, encode(header{flags: flagResync | flagLast, sender: f.id, epoch: f.epoch.Load()}, out))
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return &n
}

func (f *fakePeer) lastRanges() []seqRange {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ranges
}

func (m *member) replica(name string) *backends.Replica {
	for _, r := range m.fleet.Replicas() {
		if r.Name() == name {
			return r
		}
	}
	return nil
}

// place places a request of key on replica name as the member's router
// would for a live request: counted in flight and pending on the replica
// (so the member's own load records agree with the placement) and shared.
// finish ends it the same way.
func (m *member) place(t testing.TB, name string, key []uint32, uncached int64, ticket uint64) (id uint64, finish func()) {
	t.Helper()
	rep := m.replica(name)
	release := rep.Acquire()
	pending := m.rt.Index().RouterWriter().AddPending(rep, uncached)
	t.Cleanup(release)
	id = m.node.Placed("m", key, nil, uncached, rep, ticket, time.Now())
	return id, func() {
		pending.Prefilled()
		release()
		m.node.Finished(id)
	}
}

// pending is the prefill pending on rep in the member's Index, its own and
// its peers'.
func (m *member) pending(rep *backends.Replica) int64 {
	v := m.rt.Index().View(time.Now())
	return v.Pending(rep)
}

// work is the recent prefill work the member's Index counts on rep.
func (m *member) work(rep *backends.Replica) float64 {
	v := m.rt.Index().View(time.Now())
	return v.RecentWork(rep)
}

// holds reports how many tokens of key the member's Index says name holds.
func (m *member) holds(key []uint32, name string) int {
	rep := m.replica(name)
	v := m.rt.Index().View(time.Now())
	for _, x := range v.Match(nil, key, false) {
		if int(x.Replica) == rep.ID() {
			return x.Tokens
		}
	}
	return 0
}

func key(seed uint32, n int) []uint32 {
	k := make([]uint32, n)
	for i := range k {
		k[i] = seed*1000 + uint32(i)
	}
	return k
}

// A new peer, a gap in its sequence and its restart each ask it to
// resync; what it replays enters the Index beside its live placements.
func TestResyncOnJoinGapAndRestart(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	old := key(2, 8)
	asked := f.answerResyncs(record{kind: recPlace, at: time.Now().UnixMicro(), replica: "e2", model: "m", key: old})
	live := key(1, 8)
	f.send(1, record{kind: recPlace, id: 1, at: time.Now().UnixMicro(), replica: "e1", model: "m", uncached: 128, key: live})
	wait.For(t, 10*time.Second, "the replayed placement", func() bool { return m.holds(old, "e2") > 0 })
	if got := m.holds(live, "e1"); got != 8*16 {
		t.Errorf("live placement: e1 holds %d tokens, want %d", got, 8*16)
	}
	if r := f.lastRanges(); !reflect.DeepEqual(r, []seqRange{{0, 1}}) {
		t.Errorf("the join's resync asked for batches %v, want [0, 1): batch 1 came live", r)
	}
	// The live placement's work counts once, not again from the replay.
	if w := m.work(m.replica("e1")); w < 120 || w > 128 {
		t.Errorf("e1's recent work %.1f, want 128 decayed a little", w)
	}
	f.send(2)
	f.send(5, record{kind: recPlace, id: 5, at: time.Now().UnixMicro(), replica: "e3", model: "m", uncached: 64, key: key(5, 4)})
	wait.For(t, 10*time.Second, "a resync after the gap", func() bool { return asked.Load() >= 2 })
	if r := f.lastRanges(); !reflect.DeepEqual(r, []seqRange{{3, 5}}) {
		t.Errorf("the gap's resync asked for batches %v, want [3, 5), the missed ones", r)
	}
	if w := m.work(m.replica("e3")); w < 60 || w > 64 {
		t.Errorf("e3's recent work %.1f, want 64 decayed a little", w)
	}
	f.epoch.Add(1) // restarted under the same id
	f.send(1)
	wait.For(t, 10*time.Second, "a resync after the restart", func() bool { return asked.Load() >= 3 })
	if r := f.lastRanges(); !reflect.DeepEqual(r, []seqRange{{0, 1}}) {
		t.Errorf("the restart's resync asked for batches %v, want [0, 1)", r)
	}
	st := m.node.Stats()
	if st.Gaps != 2 || st.Peers != 1 || st.Malformed != 0 {
		t.Errorf("stats %+v, want 2 gaps, 1 peer, nothing malformed", st)
	}
}

// resyncRequest is one resync request a fakePeer received.
type resyncRequest struct {
	ranges []seqRange
	reply  string
}

// takeResyncs passes every resync request to the test to answer (or not).
func (f *fakePeer) takeResyncs() <-chan resyncRequest {
	ch := make(chan resyncRequest, 16)
	_, err := f.nc.Subscribe("kvroute.t.sync."+f.id, func(msg *nats.Msg) {
		ranges, err := openSync(msg.Data)
		if err != nil {
			f.t.Errorf("resync request %x: %v", msg.Data, err)
			return
		}
		ch <- resyncRequest{ranges: ranges, reply: msg.Reply}
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return ch
}

// answer replies to r with recs as one last chunk.
func (f *fakePeer) answer(r resyncRequest, recs ...record) {
	f.t.Helper()
	if err := f.nc.Publish(r.reply, encode(header{flags: flagResync | flagLast, sender: f.id, epoch: f.epoch.Load()}, recs)); err != nil {
		f.t.Fatal(err)
	}
}

func nextResync(t *testing.T, ch <-chan resyncRequest, within time.Duration) resyncRequest {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(within):
		t.Fatalf("no resync request within %v", within)
		return resyncRequest{}
	}
}

// A resync whose answer never comes is asked again, and a gap seen while a
// resync is under way is asked for once it ends: neither is lost (a NATS
// outage can swallow a request or its answer, and the sequence has moved
// on by the time the next batch shows the gap).
func TestResyncLostOrOverlappedIsAskedAgain(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	reqs := f.takeResyncs()
	f.send(1)
	if r := nextResync(t, reqs, 5*time.Second); !reflect.DeepEqual(r.ranges, []seqRange{{0, 1}}) {
		t.Fatalf("the join's resync asked for %v, want [0, 1)", r.ranges)
	}
	// Unanswered. A gap meanwhile asks nothing yet; the peer speaks on.
	f.send(2)
	f.send(5)
	seq := uint64(5)
	lost := key(4, 8)
	var r resyncRequest
	for r.reply == "" {
		select {
		case r = <-reqs:
		case <-time.After(100 * time.Millisecond):
			seq++
			f.send(seq)
		}
		if seq > 5+10*uint64(resyncIdle/time.Second+5) {
			t.Fatal("the unanswered resync was not asked again")
		}
	}
	if want := []seqRange{{0, 1}, {3, 5}}; !reflect.DeepEqual(r.ranges, want) {
		t.Errorf("the repeated resync asked for %v, want %v (the lost one's and the gap's)", r.ranges, want)
	}
	// Answered late: a gap seen before the answer asks again from there.
	f.send(seq + 1)
	f.send(seq + 4)
	wait.For(t, 5*time.Second, "the gap to be seen", func() bool { return m.node.Stats().Gaps == 2 })
	f.answer(r, record{kind: recPlace, at: time.Now().UnixMicro(), replica: "e3", model: "m", key: lost})
	wait.For(t, 5*time.Second, "the replayed placement", func() bool { return m.holds(lost, "e3") > 0 })
	r = nextResync(t, reqs, 5*time.Second)
	if want := []seqRange{{seq + 2, seq + 4}}; !reflect.DeepEqual(r.ranges, want) {
		t.Errorf("the overlapped gap's resync asked for %v, want %v", r.ranges, want)
	}
	f.answer(r)
	select {
	case r := <-reqs:
		t.Errorf("a resync for %v after every gap was answered", r.ranges)
	case <-time.After(resyncIdle + 500*time.Millisecond):
	}
}

// A peer's placement counts on its replica as in flight and pending until
// its lifecycle says otherwise; a failure retracts it from the Index.
func TestPeerPlacementLifecycle(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	f.answerResyncs()
	e0 := m.replica("e0")
	k := key(3, 4)
	f.send(1, record{kind: recPlace, id: 9, at: time.Now().UnixMicro(), replica: "e0", model: "m", uncached: 500, key: k})
	wait.For(t, 10*time.Second, "the placement", func() bool { return e0.PeerInFlight() == 1 })
	if p := m.pending(e0); p != 500 {
		t.Errorf("pending %d, want 500", p)
	}
	if m.holds(k, "e0") == 0 {
		t.Error("the placement is not in the Index")
	}
	f.send(2, record{kind: recPrefill, id: 9})
	wait.For(t, 10*time.Second, "the prefill", func() bool { return m.pending(e0) == 0 })
	f.send(3, record{kind: recFail, id: 9})
	wait.For(t, 10*time.Second, "the failure", func() bool { return e0.PeerInFlight() == 0 })
	if got := m.holds(k, "e0"); got != 0 {
		t.Errorf("a failed placement still holds %d tokens", got)
	}
	// A record naming a replica this instance lacks is counted, not applied.
	f.send(4, record{kind: recPlace, id: 10, at: time.Now().UnixMicro(), replica: "nowhere", key: k})
	wait.For(t, 10*time.Second, "the unknown replica", func() bool { return m.node.Stats().Unknown == 1 })
}

// A peer's load is the replica's fleet-wide load while the peer speaks,
// and stops counting once it falls silent.
func TestPeerLoadAndSilence(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	asked := f.answerResyncs()
	e1 := m.replica("e1")
	f.send(1, record{kind: recLoad, replica: "e1", inflight: 5, pending: 1000})
	wait.For(t, 10*time.Second, "the load", func() bool { return e1.PeerInFlight() == 5 })
	if e1.Load() != 5 || m.pending(e1) != 1000 {
		t.Errorf("load %d pending %d, want 5 and 1000", e1.Load(), m.pending(e1))
	}
	wait.For(t, 10*time.Second, "the silent peer to stop counting", func() bool { return e1.PeerInFlight() == 0 && m.node.Stats().Peers == 0 })
	if p := m.pending(e1); p != 0 {
		t.Errorf("a silent peer's pending prefill still counts: %d", p)
	}
	// Speaking again in sequence, it counts again with no resync.
	f.send(2, record{kind: recLoad, replica: "e1", inflight: 2})
	wait.For(t, 10*time.Second, "the peer back", func() bool { return e1.PeerInFlight() == 2 && m.node.Stats().Peers == 1 })
	if n := asked.Load(); n != 1 {
		t.Errorf("%d resyncs asked, want only the first one", n)
	}
}

// Two members joined by a route: what one's router decides reaches the
// other's Index, and each publishes its load as a heartbeat.
func TestTwoMembersShare(t *testing.T) {
	a := startMember(t, testConfig("a"))
	b := startMember(t, testConfig("b", a.node.ClusterAddr()))
	wait.For(t, 10*time.Second, "each to hear the other", func() bool { return a.node.Stats().Peers == 1 && b.node.Stats().Peers == 1 })
	k := key(4, 6)
	id, finish := a.place(t, "e3", k, 96, 0)
	wait.For(t, 10*time.Second, "b to record a's placement", func() bool { return b.holds(k, "e3") > 0 })
	wait.For(t, 10*time.Second, "b to count it in flight", func() bool { return b.replica("e3").PeerInFlight() == 1 })
	a.node.Settled(id, 16)
	wait.For(t, 10*time.Second, "b to settle its work", func() bool { return b.work(b.replica("e3")) <= 16 })
	finish()
	wait.For(t, 10*time.Second, "b to see it end", func() bool { return b.replica("e3").PeerInFlight() == 0 })
	a.node.Bound("sess-1", a.replica("e2"), time.Now())
	wait.For(t, 10*time.Second, "b to learn the binding", func() bool { return b.rt.Sessions().Lookup("sess-1", time.Now()) == b.replica("e2") })
	if st := a.node.Stats(); !st.Connected || st.SentMessages == 0 || st.Records == 0 {
		t.Errorf("a's stats %+v", st)
	}
}

// A peer's trim on an engine's report applies here too: what the engine
// evicted beyond the reported point stops counting.
func TestPeerTrim(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	f.answerResyncs()
	a := key(5, 8)
	b := append(append([]uint32(nil), a[:4]...), key(6, 4)...)
	now := time.Now().UnixMicro()
	f.send(1, record{kind: recPlace, id: 20, at: now, replica: "e0", key: a},
		record{kind: recPlace, id: 21, at: now, replica: "e0", key: b})
	wait.For(t, 10*time.Second, "both placements", func() bool { return m.holds(a, "e0") == 8*16 && m.holds(b, "e0") == 8*16 })
	// The engine found only 2 blocks of b: a, branching from b after 4,
	// keeps only what it shares with b, which was just prefilled again.
	f.send(2, record{kind: recTrim, id: 21, cached: 2 * 16})
	wait.For(t, 10*time.Second, "the trim", func() bool { return m.holds(a, "e0") == 4*16 })
	if got := m.holds(b, "e0"); got != 8*16 {
		t.Errorf("the trimmed placement's own prompt holds %d tokens, want %d (just prefilled again)", got, 8*16)
	}
	if m.rt.Index().Trims() != 1 {
		t.Errorf("%d trims counted, want 1", m.rt.Index().Trims())
	}
}

// A peer's settled work replaces what its placement counted, as of the
// placement's time, once; a settle for a placement never heard of, or one
// without a key, moves nothing; a failure takes back unsettled work.
func TestPeerSettle(t *testing.T) {
	m := startMember(t, testConfig("a"))
	f := newFakePeer(t, m)
	f.answerResyncs()
	e0, e1 := m.replica("e0"), m.replica("e1")
	work := func(rep *backends.Replica) float64 { return m.work(rep) }
	near := func(got, want float64) bool { return got > want*0.98 && got <= want*1.0001 }
	now := time.Now().UnixMicro()
	f.send(1, record{kind: recPlace, id: 30, at: now, replica: "e0", uncached: 4000, key: key(9, 4)},
		record{kind: recPlace, id: 31, at: now, replica: "e1", uncached: 3000})
	wait.For(t, 10*time.Second, "the placement's work", func() bool { return work(e0) > 0 })
	if !near(work(e0), 4000) {
		t.Fatalf("work on e0 %.0f after a placement of 4000 uncached tokens", work(e0))
	}
	f.send(2, record{kind: recSettle, id: 30, work: 1000})
	wait.For(t, 10*time.Second, "the settle", func() bool { return work(e0) < 2000 })
	if !near(work(e0), 1000) {
		t.Errorf("work on e0 %.0f, want the engine's 1000", work(e0))
	}
	// A second settle of the same placement, one of a placement never
	// heard of, and one of a placement without a key: then a record to
	// know they were applied.
	f.send(3, record{kind: recSettle, id: 30, work: 9000}, record{kind: recSettle, id: 99, work: 9000},
		record{kind: recSettle, id: 31, work: 9000}, record{kind: recLoad, replica: "e2", inflight: 7})
	wait.For(t, 10*time.Second, "the marker", func() bool { return m.replica("e2").PeerInFlight() == 7 })
	if !near(work(e0), 1000) || work(e1) != 0 {
		t.Errorf("work on e0 %.0f, e1 %.0f after settles to ignore; want 1000 and 0", work(e0), work(e1))
	}
	// A failed attempt takes back the work its placement counted (its
	// replica computed nothing), unless the engine had settled it.
	f.send(4, record{kind: recPlace, id: 32, at: now, replica: "e1", uncached: 3000, key: key(8, 4)})
	wait.For(t, 10*time.Second, "the third placement's work", func() bool { return work(e1) > 0 })
	f.send(5, record{kind: recFail, id: 30}, record{kind: recFail, id: 32})
	wait.For(t, 10*time.Second, "the failure", func() bool { return work(e1) < 1 })
	if !near(work(e0), 1000) {
		t.Errorf("work on e0 %.0f after its settled attempt failed; want the engine's 1000 still", work(e0))
	}
}

// Routes over mutual TLS with a token: members with certificates of the
// cluster's CA and its token join; one whose certificate another CA signed
// does not.
func TestRouteTLSAndToken(t *testing.T) {
	ca := testca.New(t)
	secure := func(id string, leaf testca.Leaf, peers ...string) config.Cluster {
		c := testConfig(id, peers...)
		c.Token = "route-secret-1"
		c.TLS = config.ClusterTLS{CertFile: leaf.CertFile, KeyFile: leaf.KeyFile, CAFile: ca.File}
		return c
	}
	a := startMember(t, secure("a", ca.Peer(t, "127.0.0.1")))
	b := startMember(t, secure("b", ca.Peer(t, "127.0.0.1"), a.node.ClusterAddr()))
	wait.For(t, 10*time.Second, "the TLS route", func() bool { return a.node.Stats().Peers == 1 && b.node.Stats().Peers == 1 })
	k := key(7, 4)
	b.place(t, "e1", k, 64, 0)
	wait.For(t, 10*time.Second, "a placement over the TLS route", func() bool { return a.holds(k, "e1") > 0 })

	other := testca.New(t)
	c := startMember(t, secure("c", other.Peer(t, "127.0.0.1"), a.node.ClusterAddr()))
	wrong := secure("d", ca.Peer(t, "127.0.0.1"), a.node.ClusterAddr())
	wrong.Token = "not-the-secret"
	d := startMember(t, wrong)
	time.Sleep(500 * time.Millisecond) // several load intervals: c and d would have been heard by now
	for name, m := range map[string]*member{"a foreign certificate": c, "a wrong token": d} {
		if got := m.node.Stats().Peers; got != 0 {
			t.Errorf("a member with %s hears %d peers", name, got)
		}
	}
	if got := a.node.Stats().Peers; got != 1 {
		t.Errorf("a hears %d peers, want only b", got)
	}
}

// openSync opens a resync request sealed as testConfig's members seal and
// returns its ranges.
func openSync(b []byte) ([]seqRange, error) {
	body, err := testSeal.open(b, syncMagic1, syncVersion)
	if err != nil {
		return nil, err
	}
	_, ranges, err := decodeSync(body)
	return ranges, err
}
