package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/lograte"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/telemetry"
)

// Fleet is the part of backends.Fleet a Node needs: the replicas, which it
// finds by name (every instance names a replica alike: the same backend
// list, or the same discovery).
type Fleet interface {
	Replicas() []*backends.Replica
}

// Router is the part of router.Router a Node needs: it hears of the
// router's decisions (SetSharer), applies the peers' (their placements
// through its Index's PeerWriter) and reads the pending prefill it reports.
type Router interface {
	SetSharer(router.Sharer)
	PeerBound(session router.PeerDigest, rep *backends.Replica, at time.Time)
	PeerStored(id router.PeerDigest, rep *backends.Replica)
	// SetPeerKey makes the router keep sessions and response ids by
	// their digests under the cluster's key, as peers send them.
	SetPeerKey(*router.PeerKey)
	Index() *index.Index
	// SetCoordinator makes the node choose, as the cluster's leader or
	// by asking it, the replica of the requests placed on load (lead.go).
	SetCoordinator(router.Coordinator)
	// Reserve chooses, as the cluster's leader, the replica of a peer's
	// request placed on load (lead.go).
	Reserve(model string, key []uint32, tokens int) (*router.Reservation, error)
}

// Options configure a Node.
type Options struct {
	Config config.Cluster
	Fleet  Fleet
	Router Router
	Log    *zap.Logger
	// Horizon is how far back a resync reaches: records older than it are
	// not replayed (the Index's TTL, beyond which entries no longer count).
	// 0: all the journal holds.
	Horizon func() time.Duration
	// DiscoveryInterval is how often cluster.discover is re-resolved.
	// Default 10s.
	DiscoveryInterval time.Duration
	// MaxConnsPerReplica is the most requests one instance can have in
	// flight on a replica (limits.max_conns_per_replica): what a peer's
	// claim is held to while the replica's metrics are not fresh. 0: no
	// such bound.
	MaxConnsPerReplica int
}

// Stats are a Node's counters. They are telemetry's type itself, so the
// server registers Node.Stats for /metrics without copying fields.
type Stats = telemetry.ClusterStats

// Node is one instance's member of the cluster: a Sharer for its router
// and the applier of its peers' batches.
type Node struct {
	opts Options
	id   string
	log  *zap.Logger
	warn *lograte.Limiter // every warning a message can cause
	seal *sealer
	// peerKey digests session IDs and response ids for the wire.
	peerKey *router.PeerKey
	// epoch is drawn at each start: peers tell a restart from a replay.
	epoch uint64
	subj  subjects
	embed *embedded // nil with nats_url
	nc    *nats.Conn

	outMu  sync.Mutex
	out    []byte // records of the batch being gathered
	outN   int
	seq    uint64
	kick   chan struct{}
	nextID atomic.Uint64

	journal journal

	inMu   sync.Mutex
	peers  map[string]*peer
	byName map[string]*backends.Replica
	reps   []*backends.Replica // the fleet list byName was built from
	// touched names the replicas whose peers' load the batch being applied
	// changed.
	touched map[string]struct{}
	// reserved holds this instance's reservations as the leader by ticket,
	// reservedOn their count by replica name (counted as in flight).
	reserved   map[uint64]*reservation
	reservedOn map[string]int64
	// canceled holds the cancels of tickets not reserved (yet) by time.
	canceled map[uint64]time.Time
	// replaying names the askers whose resync is being answered.
	replaying map[string]bool
	// sincePoll counts, by replica name, the peers' live placements since
	// the replica's last metrics (the load bound, totalLocked).
	sincePoll map[string]*placedSince

	leader   atomic.Pointer[string] // the leader's id; nil without live peers
	leadDown atomic.Int64           // Unix nanoseconds until which the leader is not asked
	// ticketBase and tickets make the tickets of this instance's asks.
	ticketBase uint64
	tickets    atomic.Uint64

	connected atomic.Bool
	routeAddr atomic.Pointer[string] // set by Start
	done      chan struct{}          // closed once Start's loops ended and NATS closed
	stats     struct {
		sentMsgs, sentBytes, recvMsgs, recvBytes, records  atomic.Uint64
		gaps, resyncs, replays, dropped, malformed, unknow atomic.Uint64
		leadAsked, leadMissed, leadAlone                   atomic.Uint64
		leadServed, leadLapsed                             atomic.Uint64
		peers                                              atomic.Int64
		rejected                                           [numRejects]atomic.Uint64
		lag                                                lagCounter
		leadWait                                           lagCounter
	}
}

type subjects struct {
	deltas string // this instance's live batches
	all    string // every instance's live batches
	sync   string // resync requests to this instance
	lead   string // asks to this instance as the leader
	prefix string
}

func (s subjects) syncOf(id string) string { return s.prefix + ".sync." + id }

func (s subjects) leadOf(id string) string { return s.prefix + ".lead." + id }

// chunkBytes is the size of a resync chunk; NATS's default limit on a
// message is 1 MiB.
const chunkBytes = 256 << 10

// flushBytes publishes a batch at once when it grows past this.
const flushBytes = 64 << 10

// New builds a Node; Start connects it.
func New(o Options) (*Node, error) {
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.DiscoveryInterval <= 0 {
		o.DiscoveryInterval = 10 * time.Second
	}
	c := o.Config
	id := c.ID
	if id == "" {
		id = defaultID()
	}
	k, err := deriveKeys(c)
	if err != nil {
		return nil, err
	}
	if c.MaxPeers <= 0 {
		c.MaxPeers = defaultMaxPeers
	}
	if c.MaxPeerPlacementBytes <= 0 {
		c.MaxPeerPlacementBytes = defaultMaxPeerPlacementBytes
	}
	o.Config = c
	prefix := "kvroute." + c.Name
	log := o.Log.With(zap.String("cluster_id", id))
	n := &Node{
		opts: o, id: id, log: log, warn: lograte.New(log, 0), seal: newSealer(k.message), peerKey: router.NewPeerKey(k.digest),
		subj:     subjects{deltas: prefix + ".d." + id, all: prefix + ".d.*", sync: prefix + ".sync." + id, lead: prefix + ".lead." + id, prefix: prefix},
		kick:     make(chan struct{}, 1),
		done:     make(chan struct{}),
		peers:    map[string]*peer{},
		touched:  map[string]struct{}{},
		reserved: map[uint64]*reservation{}, reservedOn: map[string]int64{}, canceled: map[uint64]time.Time{},
		replaying: map[string]bool{}, sincePoll: map[string]*placedSince{},
	}
	n.journal.max = c.JournalBytes
	var b [16]byte
	_, _ = rand.Read(b[:])
	n.ticketBase = binary.LittleEndian.Uint64(b[:8])
	n.epoch = binary.LittleEndian.Uint64(b[8:])
	o.Router.SetPeerKey(n.peerKey)
	return n, nil
}

// defaultID is the host name with a random suffix: unique per start.
func defaultID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	clean := make([]byte, 0, len(host))
	for i := 0; i < len(host) && len(clean) < 48; i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			clean = append(clean, c)
		}
	}
	if len(clean) == 0 {
		clean = append(clean, "kvroute"...)
	}
	return string(clean) + "-" + hex.EncodeToString(b[:])
}

// ID returns the instance's id in the cluster.
func (n *Node) ID() string { return n.id }

// Start runs the embedded NATS server (unless nats_url is set), connects,
// subscribes and starts the background loops, all tied to ctx; the
// router's decisions are shared from then on. An unreachable nats_url is
// not an error: the connection is retried in the background.
func (n *Node) Start(ctx context.Context) error {
	c := n.opts.Config
	natsOpts := []nats.Option{
		nats.Name("kvroute " + n.id),
		nats.NoEcho(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(8 << 20),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // closed on purpose
			}
			n.log.Warn("cluster: NATS connection lost; routing on this instance's own view", zap.Error(err))
		}),
		nats.ReconnectHandler(func(*nats.Conn) { n.log.Info("cluster: NATS connection restored") }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			n.log.Warn("cluster: NATS error", zap.Error(err))
		}),
	}
	url := c.NATSURL
	if url == "" {
		e, err := startEmbedded(c, n.id, n.log)
		if err != nil {
			return err
		}
		n.embed = e
		natsOpts = append(natsOpts, nats.InProcessServer(e.ns), nats.Token(e.token))
	} else {
		if c.Token != "" {
			natsOpts = append(natsOpts, nats.Token(c.Token))
		}
		if c.TLS.CAFile != "" {
			natsOpts = append(natsOpts, nats.RootCAs(c.TLS.CAFile))
		}
		if c.TLS.CertFile != "" {
			natsOpts = append(natsOpts, nats.ClientCert(c.TLS.CertFile, c.TLS.KeyFile))
		}
	}
	nc, err := nats.Connect(url, natsOpts...)
	if err != nil {
		n.stopEmbedded()
		return fmt.Errorf("cluster: connect to NATS: %w", err)
	}
	n.nc = nc
	if _, err := nc.Subscribe(n.subj.all, func(m *nats.Msg) { n.receive(m.Data) }); err != nil {
		n.close()
		return fmt.Errorf("cluster: subscribe: %w", err)
	}
	if _, err := nc.Subscribe(n.subj.sync, n.syncAsked); err != nil {
		n.close()
		return fmt.Errorf("cluster: subscribe: %w", err)
	}
	if _, err := nc.Subscribe(n.subj.lead, n.answer); err != nil {
		n.close()
		return fmt.Errorf("cluster: subscribe: %w", err)
	}
	if nc.IsConnected() {
		// The subscriptions reach the server asynchronously: a round trip
		// makes sure they are in place before Start returns.
		_ = nc.FlushTimeout(time.Second)
	}
	if n.embed != nil {
		a := n.embed.routeAddr()
		n.routeAddr.Store(&a)
	}
	n.opts.Router.SetSharer(n)
	n.opts.Router.SetCoordinator(n)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); n.flushLoop(ctx) }()
	go func() { defer wg.Done(); n.tickLoop(ctx) }()
	if n.embed != nil && c.Discover != "" {
		wg.Add(1)
		go func() { defer wg.Done(); n.embed.discoverLoop(ctx, n.opts.DiscoveryInterval) }()
	}
	go func() {
		<-ctx.Done()
		wg.Wait()
		n.opts.Router.SetSharer(nil)
		n.index().SetPeers(0)
		n.opts.Router.SetCoordinator(nil)
		n.close()
		close(n.done)
	}()
	n.log.Info("cluster: started", zap.String("name", c.Name), zap.String("route_addr", n.ClusterAddr()), zap.Bool("embedded", n.embed != nil))
	return nil
}

// Done is closed once the Node stopped after its Start context ended: its
// last batch published, its NATS connection and embedded server closed.
func (n *Node) Done() <-chan struct{} { return n.done }

// ClusterAddr is the embedded NATS server's route address (host:port), ""
// with nats_url or before Start.
func (n *Node) ClusterAddr() string {
	if a := n.routeAddr.Load(); a != nil {
		return *a
	}
	return ""
}

func (n *Node) close() {
	if n.nc != nil {
		if n.nc.IsConnected() {
			_ = n.nc.FlushTimeout(time.Second)
		}
		n.nc.Close()
	}
	n.stopEmbedded()
}

func (n *Node) stopEmbedded() {
	if n.embed != nil {
		n.embed.stop()
	}
}

// Stats returns the Node's counters.
func (n *Node) Stats() Stats {
	return Stats{
		SentMessages: n.stats.sentMsgs.Load(), SentBytes: n.stats.sentBytes.Load(),
		ReceivedMessages: n.stats.recvMsgs.Load(), ReceivedBytes: n.stats.recvBytes.Load(),
		Records: n.stats.records.Load(), Peers: int(n.stats.peers.Load()), Connected: n.connected.Load(),
		Gaps: n.stats.gaps.Load(), Resyncs: n.stats.resyncs.Load(), Replays: n.stats.replays.Load(),
		Dropped: n.stats.dropped.Load(), Malformed: n.stats.malformed.Load(), Unknown: n.stats.unknow.Load(),
		JournalBytes: n.journal.size(), Leading: n.leaderID() == n.id,
		LeadAsked: n.stats.leadAsked.Load(), LeadMissed: n.stats.leadMissed.Load(), LeadAlone: n.stats.leadAlone.Load(),
		LeadServed: n.stats.leadServed.Load(), LeadLapsed: n.stats.leadLapsed.Load(),
		Rejected: n.rejectedCounts(),
	}
}

// leaderID is the leader's id, "" without live peers.
func (n *Node) leaderID() string {
	if p := n.leader.Load(); p != nil {
		return *p
	}
	return ""
}

// PlacementLag returns how long peers' live placements took from their
// decision to this instance's Index (replayed ones are not counted).
func (n *Node) PlacementLag() Lag { return n.stats.lag.snapshot() }

// LeadWait returns how long this instance waited for the leader's answers
// (lead.go), those past cluster.lead_timeout included.
func (n *Node) LeadWait() Lag { return n.stats.leadWait.snapshot() }

// The Sharer side: the router's decisions become records of the batch
// being gathered; placements, bindings and ids also enter the journal.

var _ router.Sharer = (*Node)(nil)

// Placed implements router.Sharer.
func (n *Node) Placed(model string, key, exact []uint32, uncached int64, rep *backends.Replica, ticket uint64, now time.Time) uint64 {
	id := n.nextID.Add(1)
	n.add(&record{kind: recPlace, id: id, at: now.UnixMicro(), replica: rep.Name(), model: model, uncached: uint64(max(uncached, 0)), key: key, exact: exact, ticket: ticket},
		len(key) > 0 || len(exact) > 0)
	return id
}

// Prefilled implements router.Sharer.
func (n *Node) Prefilled(id uint64) { n.add(&record{kind: recPrefill, id: id}, false) }

// Finished implements router.Sharer.
func (n *Node) Finished(id uint64) { n.add(&record{kind: recFinish, id: id}, false) }

// Failed implements router.Sharer.
func (n *Node) Failed(id uint64) { n.add(&record{kind: recFail, id: id}, false) }

// Trimmed implements router.Sharer.
func (n *Node) Trimmed(id uint64, cached int) {
	n.add(&record{kind: recTrim, id: id, cached: uint64(max(cached, 0))}, false)
}

// Settled implements router.Sharer.
func (n *Node) Settled(id uint64, work int64) {
	n.add(&record{kind: recSettle, id: id, work: uint64(max(work, 0))}, false)
}

// Bound implements router.Sharer.
func (n *Node) Bound(session string, rep *backends.Replica, now time.Time) {
	n.add(&record{kind: recSession, at: now.UnixMicro(), digest: n.peerKey.Digest(session), replica: rep.Name()}, true)
}

// Stored implements router.Sharer.
func (n *Node) Stored(id string, rep *backends.Replica) {
	n.add(&record{kind: recStored, at: time.Now().UnixMicro(), digest: n.peerKey.Digest(id), replica: rep.Name()}, true)
}

// add appends rec to the batch being gathered and, when keep, to the
// journal (a replayed placement's id is ignored: its lifecycle is over).
func (n *Node) add(rec *record, keep bool) {
	n.outMu.Lock()
	start := len(n.out)
	n.out = appendRecord(n.out, rec, 0)
	if keep {
		// Encoded once for both: the journal's records and the live
		// batches' have base time 0. Under outMu: the record goes out in
		// the next batch, seq+1.
		n.journal.add(rec.at, n.seq+1, slices.Clone(n.out[start:]))
	}
	n.outN++
	first, full := n.outN == 1, len(n.out) >= flushBytes
	n.outMu.Unlock()
	if first || full {
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// flushLoop publishes the gathered batch batch_interval after its first
// record (at once when it is large), until ctx ends.
func (n *Node) flushLoop(ctx context.Context) {
	wait := n.opts.Config.BatchInterval
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		select {
		case <-ctx.Done():
			n.flush()
			return
		case <-n.kick:
		}
		if wait > 0 {
			t.Reset(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				n.flush()
				return
			case <-t.C:
			case <-n.kick: // grown large: publish now
				t.Stop()
			}
		}
		n.flush()
	}
}

// flush publishes the gathered batch, if any, as the next in sequence. A
// batch NATS refuses is dropped: its sequence number is spent, so the
// peers see a gap and resync.
func (n *Node) flush() {
	n.outMu.Lock()
	if n.outN == 0 {
		n.outMu.Unlock()
		return
	}
	n.seq++
	msg := appendHeader(make([]byte, 0, len(n.out)+96), header{sender: n.id, epoch: n.epoch, seq: n.seq})
	msg = n.seal.seal(append(msg, n.out...))
	records := uint64(n.outN) //nolint:gosec // a count, never negative
	n.out, n.outN = n.out[:0], 0
	if cap(n.out) > 4*flushBytes {
		n.out = nil
	}
	n.outMu.Unlock()
	n.publish(n.subj.deltas, msg)
	n.stats.records.Add(records)
}

func (n *Node) publish(subject string, msg []byte) {
	if err := n.nc.Publish(subject, msg); err != nil {
		n.stats.dropped.Add(1)
		return
	}
	n.stats.sentMsgs.Add(1)
	n.stats.sentBytes.Add(uint64(len(msg)))
}

// tickLoop publishes this instance's load every load_interval (its
// heartbeat), drops silent peers and old placements, and notes whether
// the cluster is reachable, until ctx ends.
func (n *Node) tickLoop(ctx context.Context) {
	iv := n.opts.Config.LoadInterval
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		n.publishLoad()
		n.maintain(time.Now(), n.silence())
		n.noteReachable()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// publishLoad adds a load record per replica: this instance's own requests
// in flight and pending prefill.
func (n *Node) publishLoad() {
	var v index.View
	ix := n.opts.Router.Index()
	if ix != nil {
		v = ix.View(time.Now())
	}
	for _, rep := range n.opts.Fleet.Replicas() {
		rec := record{kind: recLoad, replica: rep.Name(), inflight: uint64(max(rep.InFlight(), 0))}
		if ix != nil {
			rec.pending = uint64(max(v.OwnPending(rep), 0))
		}
		n.add(&rec, false)
	}
}

// index is the router's Index as the peers write it; its zero value (no
// Index) writes nothing.
func (n *Node) index() index.PeerWriter {
	if ix := n.opts.Router.Index(); ix != nil {
		return ix.PeerWriter()
	}
	return index.PeerWriter{}
}

// noteReachable updates Connected and logs its changes.
func (n *Node) noteReachable() {
	up := n.nc.IsConnected()
	if up && n.embed != nil && n.embed.hasPeers() {
		up = n.embed.ns.NumRoutes() > 0
	}
	if was := n.connected.Swap(up); was != up {
		if up {
			n.log.Info("cluster: peers reachable; sharing routing state")
		} else {
			n.log.Warn("cluster: no peer reachable; routing on this instance's own view until they return")
		}
	}
}

// minSilence is the shortest silence after which a peer counts as gone: a
// busy or paused instance may miss a few load intervals.
const minSilence = 2 * time.Second

// errNotStarted is returned by calls that need a connection before Start.
var errNotStarted = errors.New("cluster: not started")

// resync asks peer id to replay its journal from its live batch fromSeq
// on (0: all it holds); the chunks arrive on an inbox of their own and
// apply as they come. A resync whose next chunk is resyncIdle late counts
// as lost, and endSync asks again while the peer speaks. A request that
// cannot be sent is not repeated: the next gap asks again.
func (n *Node) resync(id string, ranges []seqRange) error {
	if n.nc == nil {
		return errNotStarted
	}
	n.stats.resyncs.Add(1)
	inbox := n.nc.NewRespInbox()
	done := make(chan struct{})
	chunk := make(chan struct{}, 1)
	var once sync.Once
	// The reply's bytes (the callback runs for one message at a time): past
	// limit, more than a journal like this instance's holds, the rest is
	// dropped.
	var got int64
	limit := 2*n.opts.Config.JournalBytes + chunkBytes
	sub, err := n.nc.Subscribe(inbox, func(m *nats.Msg) {
		if got > limit {
			return
		}
		if got += int64(len(m.Data)); got > limit {
			n.rejected(rejectResyncSize)
			n.warn.Warn(RejectReasons[rejectResyncSize], "cluster: a resync reply outgrew twice cluster.journal_bytes; the rest is dropped",
				zap.String("peer", id), zap.Int64("limit", limit))
			once.Do(func() { close(done) })
			return
		}
		if last := n.receive(m.Data); last {
			once.Do(func() { close(done) })
			return
		}
		select {
		case chunk <- struct{}{}:
		default:
		}
	})
	if err != nil {
		n.endSync(id, ranges, false)
		return err
	}
	if err := n.nc.PublishRequest(n.subj.syncOf(id), inbox, n.seal.seal(encodeSync(n.id, ranges))); err != nil {
		_ = sub.Unsubscribe()
		n.endSync(id, ranges, false)
		return err
	}
	go func() {
		idle := time.NewTimer(resyncIdle)
		defer idle.Stop()
		lost := true
	wait:
		for {
			select {
			case <-done:
				lost = false
				break wait
			case <-chunk:
				idle.Reset(resyncIdle)
			case <-n.done:
				return // stopped: the connection and its inbox are gone
			case <-idle.C:
				select {
				case <-n.done:
					return
				default:
				}
				n.warn.Warn("resync_unanswered", "cluster: resync went unanswered", zap.String("peer", id), zap.Duration("waited", resyncIdle))
				break wait
			}
		}
		_ = sub.Unsubscribe()
		n.endSync(id, ranges, lost)
	}()
	return nil
}

// resyncIdle is how long a resync waits for its first or next chunk.
const resyncIdle = 2 * time.Second

// silence is how long a peer may be quiet before it counts as gone.
func (n *Node) silence() time.Duration { return max(3*n.opts.Config.LoadInterval, minSilence) }

// replay answers a resync request: the journal's records within the
// horizon sent in the live batches of ranges, in chunks, the last flagged.
func (n *Node) replay(reply string, ranges []seqRange) {
	if reply == "" {
		return
	}
	n.stats.replays.Add(1)
	var notBefore int64
	if n.opts.Horizon != nil {
		if h := n.opts.Horizon(); h > 0 {
			notBefore = time.Now().Add(-h).UnixMicro()
		}
	}
	chunks := n.journal.chunks(notBefore, ranges, chunkBytes)
	if len(chunks) == 0 {
		chunks = [][]byte{nil}
	}
	for i, c := range chunks {
		flags := uint8(flagResync)
		if i == len(chunks)-1 {
			flags |= flagLast
		}
		msg := appendHeader(make([]byte, 0, len(c)+96), header{flags: flags, sender: n.id, epoch: n.epoch})
		n.publish(reply, n.seal.seal(append(msg, c...)))
	}
}
