package server_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// clusterToken is the test cluster's route token (and its NATS's).
const clusterToken = "test-cluster-token-0123"

// clusterOpt makes a kvroute a member of the test cluster "t" under id,
// its routes on 127.0.0.1 (a port of the kernel's choosing), joining
// through peers.
func clusterOpt(id string, peers ...string) kvtest.Option {
	return func(cfg *config.Config) {
		cfg.Policy = "cache_aware"
		cfg.Cluster = config.Cluster{Enabled: true, Name: "t", ID: id, Listen: "127.0.0.1:0", Peers: peers, Token: clusterToken,
			BatchInterval: time.Millisecond, LoadInterval: 50 * time.Millisecond, JournalBytes: 8 << 20,
			MaxPeers: 16, MaxPeerPlacementBytes: 8 << 20}
	}
}

// startRouters runs n clustered kvroutes in front of reps and waits until
// each hears from all the others.
func startRouters(t *testing.T, n int, reps []*kvtest.Replica, opts ...kvtest.Option) []*kvtest.KV {
	t.Helper()
	var kvs []*kvtest.KV
	var seed []string
	for i := 0; i < n; i++ {
		k := kvtest.Start(t, reps, append([]kvtest.Option{clusterOpt(fmt.Sprintf("r%d", i), seed...)}, opts...)...)
		kvtest.WaitFor(t, 10*time.Second, "the route listener", func() bool { return k.Srv.ClusterAddr() != "" })
		if i == 0 {
			seed = []string{k.Srv.ClusterAddr()}
		}
		kvs = append(kvs, k)
	}
	waitPeers(t, kvs, n-1)
	return kvs
}

// waitPeers waits until every kvroute of kvs hears from want peers.
func waitPeers(t *testing.T, kvs []*kvtest.KV, want int) {
	t.Helper()
	kvtest.WaitFor(t, 15*time.Second, fmt.Sprintf("%d peers each", want), func() bool {
		for _, k := range kvs {
			if k.Srv.ClusterStats().Peers != want {
				return false
			}
		}
		return true
	})
}

// peerWrites is the number of peer placements k's Index recorded.
func peerWrites(k *kvtest.KV) uint64 { return k.Srv.Router.Index().Writes(index.SourcePeer) }

// writesOf returns the peer placements each router of kvs recorded.
func writesOf(kvs []*kvtest.KV) []uint64 {
	w := make([]uint64, 0, len(kvs))
	for _, k := range kvs {
		w = append(w, peerWrites(k))
	}
	return w
}

// waitShared waits until every router of kvs but from recorded one more
// peer placement than before (writesOf before the request), and counts no
// request of its peers in flight any more: the placement and the end of
// its request reached every peer.
func waitShared(t *testing.T, kvs []*kvtest.KV, from int, before []uint64) {
	t.Helper()
	kvtest.WaitFor(t, 10*time.Second, "the placement and its end to reach every peer", func() bool {
		for i, k := range kvs {
			if i != from && peerWrites(k) <= before[i] {
				return false
			}
			for _, r := range k.Srv.Fleet.Replicas() {
				if r.PeerInFlight() != 0 {
					return false
				}
			}
		}
		return true
	})
}

func fourReplicas(t *testing.T) []*kvtest.Replica {
	var reps []*kvtest.Replica
	for i := 0; i < 4; i++ {
		reps = append(reps, kvtest.NewReplica(t, fmt.Sprintf("e%d", i), nil))
	}
	return reps
}

var clusterSystem = strings.Repeat("You are the assistant of a fleet of routers that share what they know; answer briefly. ", 20)

// A conversation whose turns go to the three routers in turn stays on the
// replica its first turn went to: each router learned the others'
// placements. Without sharing, each turn after the first would be a cold
// request on a router that never saw the conversation.
func TestClusterConversationStaysOnOneReplica(t *testing.T) {
	kvs := startRouters(t, 3, fourReplicas(t))
	placed := make([]int, len(kvs))
	for c := 0; c < 4; c++ {
		home := ""
		for turn := 0; turn < 6; turn++ {
			from := (c + turn) % 3
			placed[from]++
			before := writesOf(kvs)
			resp, out := postJSON(t, kvs[from].URL+"/v1/chat/completions", chatBody(clusterSystem, c, turn))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			got := resp.Header.Get("X-Kvroute-Backend")
			if turn == 0 {
				home = got
			} else if got != home {
				t.Errorf("conversation %d turn %d via router %d went to %s (%s), its first turn to %s",
					c, turn, from, got, resp.Header.Get("X-Kvroute-Route"), home)
			}
			waitShared(t, kvs, from, before)
		}
	}
	for i, k := range kvs {
		st := k.Srv.ClusterStats()
		if st.Malformed != 0 || st.Unknown != 0 || st.Dropped != 0 {
			t.Errorf("router %d: %+v", i, st)
		}
		// Every placement of the other two reached this one, each counted
		// once in the lag histogram.
		heard := 24 - placed[i]
		if got := scrape(t, k.Admin)["kvroute_cluster_placement_lag_seconds"]; len(got) != 1 || got[0].value != float64(heard) {
			t.Errorf("router %d: kvroute_cluster_placement_lag_seconds %+v, want %d placements", i, got, heard)
		}
		if l := k.Srv.ClusterLag(); l.Count != uint64(heard) {
			t.Errorf("router %d: placement lag %+v, want %d placements", i, l, heard)
		}
	}
}

// A router that joins late resyncs from the others: the conversations they
// placed before it existed reach their replicas through it too.
func TestClusterNewRouterResyncs(t *testing.T) {
	reps := fourReplicas(t)
	kvs := startRouters(t, 2, reps)
	homes := map[int]string{}
	for c := 0; c < 4; c++ {
		resp, out := postJSON(t, kvs[c%2].URL+"/v1/chat/completions", chatBody(clusterSystem, c, 0))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		homes[c] = resp.Header.Get("X-Kvroute-Backend")
	}
	late := kvtest.Start(t, reps, clusterOpt("late", kvs[0].Srv.ClusterAddr()))
	kvs = append(kvs, late)
	waitPeers(t, kvs, 2)
	kvtest.WaitFor(t, 10*time.Second, "the late router's resync", func() bool { return peerWrites(late) >= 4 })
	if st := late.Srv.ClusterStats(); st.Resyncs < 2 {
		t.Errorf("the late router asked %d resyncs, want one of each peer", st.Resyncs)
	}
	for c := 0; c < 4; c++ {
		resp, out := postJSON(t, late.URL+"/v1/chat/completions", chatBody(clusterSystem, c, 1))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		if got := resp.Header.Get("X-Kvroute-Backend"); got != homes[c] {
			t.Errorf("conversation %d went to %s (%s) through the late router, its first turn to %s", c, got, resp.Header.Get("X-Kvroute-Route"), homes[c])
		}
	}
}

// Killing one of three routers loses nothing at the others: they notice it
// is gone, keep what it placed, and route on.
func TestClusterKilledRouter(t *testing.T) {
	reps := fourReplicas(t)
	var kvs []*kvtest.KV
	kvs = append(kvs, kvtest.Start(t, reps, clusterOpt("r0")))
	kvtest.WaitFor(t, 10*time.Second, "the route listener", func() bool { return kvs[0].Srv.ClusterAddr() != "" })
	seed := kvs[0].Srv.ClusterAddr()
	victim := kvtest.Start(t, reps, clusterOpt("victim", seed))
	kvs = append(kvs, kvtest.Start(t, reps, clusterOpt("r2", seed)))
	waitPeers(t, kvs, 2)

	before := writesOf(kvs)
	resp, out := postJSON(t, victim.URL+"/v1/chat/completions", chatBody(clusterSystem, 7, 0))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	home := resp.Header.Get("X-Kvroute-Backend")
	waitShared(t, kvs, -1, before)
	victim.Stop(t)
	waitPeers(t, kvs, 1)
	for turn := 1; turn < 5; turn++ {
		k := kvs[turn%2]
		resp, out := postJSON(t, k.URL+"/v1/chat/completions", chatBody(clusterSystem, 7, turn))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, out)
		}
		if got := resp.Header.Get("X-Kvroute-Backend"); got != home {
			t.Errorf("turn %d went to %s (%s), the conversation's replica is %s", turn, got, resp.Header.Get("X-Kvroute-Route"), home)
		}
	}
	// The live routers' last requests end at their peer a batch later;
	// the dead router's must not stay counted.
	peerInFlight := func() int64 {
		var n int64
		for _, k := range kvs {
			for _, fr := range k.Srv.Fleet.Replicas() {
				n += fr.PeerInFlight()
			}
		}
		return n
	}
	for deadline := time.Now().Add(5 * time.Second); peerInFlight() != 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	for _, r := range reps {
		for _, k := range kvs {
			for _, fr := range k.Srv.Fleet.Replicas() {
				if fr.Name() == r.Name && fr.PeerInFlight() != 0 {
					t.Errorf("%s still counts %d requests of the dead router in flight", r.Name, fr.PeerInFlight())
				}
			}
		}
	}
}

// With its peers unreachable (a peer address where nothing listens) a
// router serves every request on its own view and says so.
func TestClusterPeersUnreachable(t *testing.T) {
	reps := fourReplicas(t)
	dead := strings.TrimPrefix(kvtest.DeadURL(t), "http://")
	k := kvtest.Start(t, reps, clusterOpt("alone", dead))
	for c := 0; c < 3; c++ {
		home := ""
		for turn := 0; turn < 3; turn++ {
			resp, out := postJSON(t, k.URL+"/v1/chat/completions", chatBody(clusterSystem, c, turn))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			if got := resp.Header.Get("X-Kvroute-Backend"); turn == 0 {
				home = got
			} else if got != home {
				t.Errorf("conversation %d turn %d went to %s, its first turn to %s", c, turn, got, home)
			}
		}
	}
	m := scrape(t, k.Admin)
	for _, name := range []string{"kvroute_cluster_connected", "kvroute_cluster_peers"} {
		if got := m[name]; len(got) != 1 || got[0].value != 0 {
			t.Errorf("%s = %+v, want one sample of 0", name, got)
		}
	}
	if got := m["kvroute_cluster_sent_messages_total"]; len(got) != 1 || got[0].value == 0 {
		t.Errorf("kvroute_cluster_sent_messages_total = %+v: the instance should still publish to its own NATS", got)
	}
}

// With cluster.nats_url naming a NATS that is down, kvroute starts, serves,
// and keeps trying to connect.
func TestClusterNATSURLDown(t *testing.T) {
	reps := fourReplicas(t)
	dead := "nats://" + strings.TrimPrefix(kvtest.DeadURL(t), "http://")
	k := kvtest.Start(t, reps, clusterOpt("x"), func(cfg *config.Config) { cfg.Cluster.NATSURL = dead })
	resp, out := postJSON(t, k.URL+"/v1/chat/completions", chatBody(clusterSystem, 1, 0))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if st := k.Srv.ClusterStats(); st.Connected {
		t.Errorf("connected to a NATS that is down: %+v", st)
	}
}

// A Responses-API chain continues through another router: the id one
// router saw stored reaches the replica that stored it through the other.
func TestClusterResponsesChain(t *testing.T) {
	var n atomic.Int64
	var reps []*kvtest.Replica
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("e%d", i)
		reps = append(reps, kvtest.NewReplica(t, name, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"id":"resp_%s_%d","object":"response","status":"completed","output":[]}`, name, n.Add(1))
		}))
	}
	kvs := startRouters(t, 2, reps)
	prev, home := "", ""
	for turn := 0; turn < 6; turn++ {
		k := kvs[turn%2]
		body := `{"model":"m1","input":"turn ` + fmt.Sprint(turn) + `"`
		if prev != "" {
			body += `,"previous_response_id":"` + prev + `"`
		}
		body += "}"
		resp, out := postJSON(t, k.URL+"/v1/responses", body)
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, out)
		}
		got := resp.Header.Get("X-Kvroute-Backend")
		if turn == 0 {
			home = got
		} else if got != home {
			t.Errorf("turn %d via router %d went to %s (%s), the chain is on %s", turn, turn%2, got, resp.Header.Get("X-Kvroute-Route"), home)
		}
		id := jsonField(t, out, "id")
		// The other router learns the id before the next turn goes to it.
		other := kvs[(turn+1)%2]
		kvtest.WaitFor(t, 10*time.Second, "the response id to reach the other router", func() bool {
			return other.Srv.Router.Responses().Lookup(id) != nil
		})
		prev = id
	}
}

// jsonField returns the string field name of the JSON object b.
func jsonField(t *testing.T, b []byte, name string) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	s, _ := m[name].(string)
	return s
}

// natsAt runs a NATS server on 127.0.0.1:port (0: a port below 32768
// that is free) until the test ends or stop is called.
func natsAt(t *testing.T, port int) (url string, stop func()) {
	t.Helper()
	for try := 0; ; try++ {
		p := port
		if p == 0 {
			p = 20000 + rand.IntN(12000)
		}
		ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: p, NoSigs: true, NoLog: true, Authorization: clusterToken})
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		if ns.ReadyForConnections(5 * time.Second) {
			var once sync.Once
			stop := func() { once.Do(func() { ns.Shutdown(); ns.WaitForShutdown() }) }
			t.Cleanup(stop)
			return fmt.Sprintf("nats://127.0.0.1:%d", p), stop
		}
		ns.Shutdown()
		if port != 0 || try == 20 {
			t.Fatalf("no NATS server on 127.0.0.1:%d", p)
		}
	}
}

// Two routers on an existing NATS (cluster.nats_url): while it is down
// each routes on its own view without an error; once it is back they share
// again, and what one placed meanwhile reaches the other.
func TestClusterNATSOutage(t *testing.T) {
	reps := fourReplicas(t)
	url, stop := natsAt(t, 0)
	port := strings.TrimPrefix(url, "nats://127.0.0.1:")
	useNATS := func(cfg *config.Config) { cfg.Cluster.NATSURL = url }
	a := kvtest.Start(t, reps, clusterOpt("a"), useNATS)
	b := kvtest.Start(t, reps, clusterOpt("b"), useNATS)
	kvs := []*kvtest.KV{a, b}
	waitPeers(t, kvs, 1)

	stop()
	kvtest.WaitFor(t, 10*time.Second, "both to notice", func() bool {
		return !a.Srv.ClusterStats().Connected && !b.Srv.ClusterStats().Connected
	})
	before := peerWrites(b)
	home := map[int]string{}
	for c := 0; c < 3; c++ {
		resp, out := postJSON(t, a.URL+"/v1/chat/completions", chatBody(clusterSystem, c, 0))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d during the outage: %s", resp.StatusCode, out)
		}
		home[c] = resp.Header.Get("X-Kvroute-Backend")
	}
	var p int
	_, _ = fmt.Sscan(port, &p)
	natsAt(t, p)
	kvtest.WaitFor(t, 20*time.Second, "the placements made during the outage to reach b", func() bool {
		return peerWrites(b) >= before+3
	})
	for c := 0; c < 3; c++ {
		resp, out := postJSON(t, b.URL+"/v1/chat/completions", chatBody(clusterSystem, c, 1))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		if got := resp.Header.Get("X-Kvroute-Backend"); got != home[c] {
			t.Errorf("conversation %d went to %s through b after the outage, its first turn to %s", c, got, home[c])
		}
	}
}

// An instance configured with a peer it never hears warns, past a health
// interval, that it routes alone; one without peers configured does not.
func TestClusterAloneWarns(t *testing.T) {
	reps := fourReplicas(t)
	for _, c := range []struct {
		name  string
		peers []string
		warn  bool
	}{
		{"a peer that never answers", []string{strings.TrimPrefix(kvtest.DeadURL(t), "http://")}, true},
		{"no peer configured", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.WarnLevel)
			k := kvtest.StartLogged(t, zap.New(core), reps, clusterOpt("alone", c.peers...), func(cfg *config.Config) {
				cfg.Health.Interval = 200 * time.Millisecond
			})
			alone := func() bool { return logs.FilterMessageSnippet("no peer heard").Len() > 0 }
			if c.warn {
				kvtest.WaitFor(t, 10*time.Second, "the warning", alone)
				return
			}
			time.Sleep(2 * time.Second) // two watch rounds past the interval
			if alone() || k.Srv.ClusterStats().Peers != 0 {
				t.Errorf("warned with no peer configured")
			}
		})
	}
}
