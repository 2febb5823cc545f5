package attack

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/cluster"
	"github.com/kvroute/kvroute/config"
)

// The cluster attacks: a kvroute of cluster "attack" (id "victim", its
// routes on 127.0.0.1 behind clusterToken) and a hostile NATS server or
// client beside it. The rogue is a real NATS server that routes to the
// victim's cluster.listen, without the token (a stranger) or with it (a
// member that lies); or a client of a NATS server the victim shares
// (cluster.nats_url) that lacks the token.

// clusterToken is the victim cluster's route token.
const clusterToken = "attack-cluster-token-0123456789"

// ClusterSizes are how hard the cluster attacks push.
type ClusterSizes struct {
	Requests   int // cold requests counted per replica (forged load, forged lead)
	Placements int // forged placements (placements flood)
	PeerIDs    int // forged peer ids (peer ids)
}

// clusterName is the victim's cluster, and loopbackHost where every NATS
// server of these attacks listens.
const (
	clusterName  = "attack"
	loopbackHost = "127.0.0.1"
)

// clusterSizes are the figures.
var clusterSizes = ClusterSizes{Requests: 40, Placements: 1_000_000, PeerIDs: 20_000}

// clusterConfig is the victim's cluster section in config terms, for the
// Forger: its name and credential.
func clusterConfig() config.Cluster {
	return config.Cluster{Name: clusterName, Token: clusterToken}
}

// startVictim starts a clustered kvroute in front of two upstreams, its
// routes on a free port of 127.0.0.1 (returned), with extra settings.
func startVictim(e *env, name string, extra Settings) (*kvroute, []*Upstream, string, func(), error) {
	addrs, err := loopback.FreeAddrs(1)
	if err != nil {
		return nil, nil, "", nil, err
	}
	s := Settings{"cluster.enabled": true, "cluster.name": clusterName, "cluster.id": "victim", "cluster.listen": addrs[0],
		"cluster.token": clusterToken, "cluster.load_interval": "100ms"}
	for k, v := range extra {
		s[k] = v
	}
	k, ups, stop, err := e.start(name, 2, s)
	return k, ups, addrs[0], stop, err
}

// rogueServer starts a NATS server of cluster "attack" that routes to
// listen, as user:pass ("" for no credentials).
func rogueServer(listen, user, pass string) (*natsserver.Server, *nats.Conn, error) {
	u := &url.URL{Scheme: "nats-route", Host: listen}
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	ns, err := natsserver.NewServer(&natsserver.Options{ServerName: "rogue", Host: loopbackHost, Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true,
		MaxPayload: 8 << 20, Cluster: natsserver.ClusterOpts{Name: clusterName, Host: loopbackHost, Port: natsserver.RANDOM_PORT}, Routes: []*url.URL{u}})
	if err != nil {
		return nil, nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, nil, errors.New("rogue NATS server did not start")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		ns.Shutdown()
		return nil, nil, err
	}
	return ns, nc, nil
}

func stopRogue(ns *natsserver.Server, nc *nats.Conn) {
	nc.Close()
	ns.Shutdown()
	ns.WaitForShutdown()
}

// memberRogue is a rogue server routed to the victim with the token: a
// member. It waits for the route.
func memberRogue(listen string) (*natsserver.Server, *nats.Conn, error) {
	ns, nc, err := rogueServer(listen, "kvroute", clusterToken)
	if err != nil {
		return nil, nil, err
	}
	for end := time.Now().Add(10 * time.Second); ns.NumRoutes() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			stopRogue(ns, nc)
			return nil, nil, errors.New("the member rogue's route did not come up")
		}
	}
	return ns, nc, nil
}

// lyingMember starts a victim (startVictim) and a member rogue routed to
// it, and returns the rogue's connection and a Forger of the cluster's
// key; stop stops them all.
func lyingMember(e *env, name string, extra Settings) (*kvroute, []*Upstream, *nats.Conn, *cluster.Forger, func(), error) {
	k, ups, listen, stopVictim, err := startVictim(e, name, extra)
	if err != nil {
		return nil, nil, nil, nil, nil, err
	}
	ns, nc, err := memberRogue(listen)
	if err != nil {
		stopVictim()
		return nil, nil, nil, nil, nil, err
	}
	stop := func() { stopRogue(ns, nc); stopVictim() }
	f, err := cluster.NewForger(clusterConfig())
	if err != nil {
		stop()
		return nil, nil, nil, nil, nil, err
	}
	return k, ups, nc, f, stop, nil
}

// coldRequests sends n requests of distinct prompts (each with a user
// field and a session header) and returns how many each upstream got.
func coldRequests(k *kvroute, ups []*Upstream, n int) ([]int, error) {
	before := make([]int, len(ups))
	for i, u := range ups {
		before[i] = len(u.Seen())
	}
	for i := range n {
		body := fmt.Sprintf(`{"model":%q,"user":"secret-user-%d","messages":[{"role":"user","content":"cold prompt %d %d"}]}`, Model, i, i, rand.Uint64())
		if a := do(k.addr, chatRequest(k.addr, body, "X-Session-Id: secret-session-"+strconv.Itoa(i)), 10*time.Second); a.Status != 200 {
			return nil, fmt.Errorf("request %d: %s", i, describe(a))
		}
	}
	got := make([]int, len(ups))
	for i, u := range ups {
		got[i] = len(u.Seen()) - before[i]
	}
	return got, nil
}

// rejected reads kvroute_cluster_rejected_total{reason}.
func rejected(k *kvroute, reason string) float64 {
	m, err := k.metric("kvroute_cluster_rejected_total")
	if err != nil {
		return -1
	}
	return m[reason]
}

// waitReceived waits until k received at least n cluster messages.
func waitReceived(k *kvroute, n int, within time.Duration) float64 {
	var got float64
	for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if got = k.gauge("kvroute_cluster_received_messages_total"); got >= float64(n) {
			break
		}
	}
	return got
}

// clusterRogueJoin: a NATS server without the token routes to the
// victim's cluster.listen and reads what crosses while requests with
// sessions and user fields are served.
func clusterRogueJoin(e *env) (Result, error) {
	k, ups, listen, stop, err := startVictim(e, "cluster-rogue-join", nil)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	ns, nc, err := rogueServer(listen, "", "")
	if err != nil {
		return Result{}, err
	}
	defer stopRogue(ns, nc)
	var read atomic.Int64
	var secrets atomic.Int64
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		read.Add(1)
		if bytes.Contains(m.Data, []byte("secret-")) {
			secrets.Add(1)
		}
	}); err != nil {
		return Result{}, err
	}
	time.Sleep(time.Second) // the route's attempts
	if _, err := coldRequests(k, ups, 20); err != nil {
		return Result{}, err
	}
	time.Sleep(time.Second)
	// The rogue server retries its route: each attempt is up on its side
	// from the handshake until the victim refuses the credentials, so one
	// look may catch it. A route the victim accepted stays up: it holds
	// when no look in two seconds finds one up for good.
	const looks = 40
	up := 0
	for range looks {
		if ns.NumRoutes() > 0 {
			up++
		}
		time.Sleep(50 * time.Millisecond)
	}
	held := read.Load() == 0 && up < looks
	return Result{Held: held, Figure: fmt.Sprintf("a NATS server without the token routing to cluster.listen: a route up at %d of %d looks over 2 s (each attempt refused), %d messages read (%d with a raw session or user) over 20 requests",
		up, looks, read.Load(), secrets.Load())}, nil
}

// clusterForgedLoad: a member claims 1000 requests in flight and 2^30
// pending tokens on h-0 every 50 ms while cold requests are served.
func clusterForgedLoad(e *env) (Result, error) {
	return forgedLoad(e, clusterSizes.Requests)
}

func forgedLoad(e *env, n int) (Result, error) {
	k, ups, nc, f, stop, err := lyingMember(e, "cluster-forged-load", nil)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			// An id above the victim's: the victim leads.
			_ = nc.Publish(f.Subject("zz-rogue"), f.Load("zz-rogue", "h-0", 1000, 1<<30))
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	for end := time.Now().Add(10 * time.Second); k.gauge("kvroute_cluster_peers") < 1; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			return Result{}, errors.New("the victim never heard the member rogue")
		}
	}
	got, err := coldRequests(k, ups, n)
	if err != nil {
		return Result{}, err
	}
	cut := rejected(k, "load")
	held := got[0] >= n/4 && cut > 0
	return Result{Held: held, Figure: fmt.Sprintf("h-0 got %d of %d cold requests (h-1 %d) while a member claimed 1000 in flight on it; claims cut to the engine's report %.0f times",
		got[0], n, got[1], cut)}, nil
}

// clusterForgedLead: a client of the NATS server the victim shares
// (cluster.nats_url), without the token, speaks as the peer of the lowest
// id (the leader) and answers every ask with h-0.
func clusterForgedLead(e *env) (Result, error) {
	return forgedLead(e, clusterSizes.Requests)
}

func forgedLead(e *env, n int) (Result, error) {
	shared, err := natsserver.NewServer(&natsserver.Options{Host: loopbackHost, Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		return Result{}, err
	}
	go shared.Start()
	if !shared.ReadyForConnections(10 * time.Second) {
		return Result{}, errors.New("shared NATS server did not start")
	}
	defer shared.Shutdown()
	k, ups, _, stop, err := startVictim(e, "cluster-forged-lead", Settings{"cluster.nats_url": shared.ClientURL()})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	nc, err := nats.Connect(shared.ClientURL())
	if err != nil {
		return Result{}, err
	}
	defer nc.Close()
	// A stranger has no key: its batches and answers cannot be sealed.
	f, err := cluster.NewForger(config.Cluster{Name: clusterName, Token: "a-guess"})
	if err != nil {
		return Result{}, err
	}
	var asks atomic.Int64
	if _, err := nc.Subscribe(f.LeadSubject("0"), func(m *nats.Msg) {
		asks.Add(1)
		_ = m.Respond(f.Answer(m.Data, "h-0"))
	}); err != nil {
		return Result{}, err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			_ = nc.Publish(f.Subject("0"), f.Load("0", "h-1", 0, 0))
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	got, err := coldRequests(k, ups, n)
	if err != nil {
		return Result{}, err
	}
	dropped := rejected(k, "unauthenticated")
	held := asks.Load() == 0 && got[0] < n && dropped > 0
	return Result{Held: held, Figure: fmt.Sprintf("a client of the shared NATS without the token posing as the leader: asked %d times; h-0 got %d of %d cold requests (h-1 %d); %.0f of its messages dropped unauthenticated",
		asks.Load(), got[0], n, got[1], dropped)}, nil
}

// clusterPlacementsFlood: a member sends 10^6 placements of random keys.
func clusterPlacementsFlood(e *env) (Result, error) {
	return placementsFlood(e, clusterSizes.Placements)
}

func placementsFlood(e *env, n int) (Result, error) {
	if !MemSupported {
		return Result{}, errNoMem
	}
	k, _, nc, f, stop, err := lyingMember(e, "cluster-placements-flood", MemorySettings())
	if err != nil {
		return Result{}, err
	}
	defer stop()
	if a := k.normal(10 * time.Second); a.Status != 200 {
		return Result{}, fmt.Errorf("first request: %s", describe(a))
	}
	rss0, err := ReadMem(k.pid())
	if err != nil {
		return Result{}, err
	}
	base, err := k.heapAfterGC()
	if err != nil {
		return Result{}, err
	}
	recv0 := k.gauge("kvroute_cluster_received_messages_total")
	const per = 2000
	rng := rand.New(rand.NewPCG(1, 2))
	batches := 0
	for sent := 0; sent < n; sent += per {
		if err := nc.Publish(f.Subject("rogue"), f.Places("rogue", "h-0", uint64(sent)+1, min(per, n-sent), 8, rng)); err != nil {
			return Result{}, err
		}
		batches++
		if batches%50 == 0 {
			_ = nc.Flush()
			waitReceived(k, int(recv0)+batches-10, 30*time.Second)
		}
	}
	_ = nc.Flush()
	got := waitReceived(k, int(recv0)+batches, 60*time.Second)
	heap, err := k.heapAfterGC()
	if err != nil {
		return Result{}, err
	}
	peak, formula, err := underFormula(k, rss0.RSS)
	if err != nil {
		return Result{}, err
	}
	cfg, err := loaded(k)
	if err != nil {
		return Result{}, err
	}
	placeBytes, _ := Setting(cfg, "cluster.max_peer_placement_bytes")
	tree, _ := Setting(cfg, "index.tree_max_bytes")
	bound := placeBytes + tree + 16<<20
	growth := heap - base
	held := placeBytes > 0 && growth <= bound && peak.HWM <= formula.Total && k.normal(10*time.Second).Status == 200
	return Result{Held: held, Figure: fmt.Sprintf("heap %s after %d forged placements in %d batches (%.0f received); bound %s (max_peer_placement_bytes %s + tree_max_bytes %s + 16 MiB); %.0f dropped past the per-peer bound; peak RSS %s, formula %s",
		signed(growth), n, batches, got-recv0, mib(bound), mib(placeBytes), mib(tree), rejected(k, "placements"), mib(peak.HWM), mib(formula.Total))}, nil
}

// clusterPeerIDs: a member sends one batch from each of 20,000 forged ids.
func clusterPeerIDs(e *env) (Result, error) {
	return peerIDs(e, clusterSizes.PeerIDs)
}

func peerIDs(e *env, n int) (Result, error) {
	k, _, nc, f, stop, err := lyingMember(e, "cluster-peer-ids", Settings{"log.level": "info"})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	logPath := filepath.Join(k.dir, "kvroute.log")
	lines0 := lineCount(logPath)
	recv0 := k.gauge("kvroute_cluster_received_messages_total")
	for i := range n {
		id := "forged-" + strconv.Itoa(i)
		if err := nc.Publish(f.Subject(id), f.Load(id, "h-0", 1, 0)); err != nil {
			return Result{}, err
		}
		if i%1000 == 999 {
			_ = nc.Flush()
		}
	}
	_ = nc.Flush()
	waitReceived(k, int(recv0)+n, 60*time.Second)
	time.Sleep(3 * time.Second) // the resyncs of the admitted ids go unanswered
	cfg, err := loaded(k)
	if err != nil {
		return Result{}, err
	}
	lines := lineCount(logPath) - lines0
	resyncs := k.gauge("kvroute_cluster_resyncs_total")
	ignored := rejected(k, "max_peers")
	held := resyncs <= float64(cfg.Cluster.MaxPeers) && lines <= 2*cfg.Cluster.MaxPeers+20 && ignored > 0
	return Result{Held: held, Figure: fmt.Sprintf("%d forged peer ids: %d log lines, %.0f resyncs, %.0f ignored past cluster.max_peers %d",
		n, lines, resyncs, ignored, cfg.Cluster.MaxPeers)}, nil
}

// lineCount counts the lines of the file at path (0 when unreadable).
func lineCount(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte("\n"))
}
