package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Fleet is a set of replicas served on 127.0.0.1.
type Fleet struct {
	// Replicas are the replicas (engines), in port order; with
	// Config.DataParallelSize D above 1, server i's rank r is Replicas[i*D+r].
	Replicas []*Replica
	// URLs are their base URLs ("http://127.0.0.1:port"), same order: the
	// ranks of one server share theirs.
	URLs []string

	arrivals arrivals // what each request found in every replica's cache
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	once     sync.Once
}

// StartFleet starts n replicas configured by cfg on 127.0.0.1:basePort ..
// basePort+n-1, or on random free ports when basePort is 0. Replica i is
// named cfg.Name+"-i" ("sim-i" by default); with cfg.KVEvents it publishes
// on cfg.KVEventsPort+i and replays on cfg.KVEventsReplayPort+i (free
// ports where those are 0; see KVEvents). With cfg.DataParallelSize D
// above 1, each of the n servers runs D engines behind its port (see
// rankGroup), rank r of server i named "sim-i-dp<r>" and publishing on
// the ports + i×D + r, as vLLM's rank r publishes on its configured port
// + r. The fleet stops when ctx ends or Close is called.
func StartFleet(ctx context.Context, n int, basePort int, cfg Config) (*Fleet, error) {
	return startFleet(ctx, n, basePort, cfg, nil)
}

// StartRoleFleet is StartFleet for a disaggregated fleet: one replica per
// role, replica i with Config.Role roles[i].
func StartRoleFleet(ctx context.Context, roles []string, basePort int, cfg Config) (*Fleet, error) {
	return startFleet(ctx, len(roles), basePort, cfg, roles)
}

func startFleet(ctx context.Context, n int, basePort int, cfg Config, roles []string) (*Fleet, error) {
	if n <= 0 {
		return nil, fmt.Errorf("sim: fleet of %d replicas", n)
	}
	name := cfg.Name
	if name == "" {
		name = "sim"
	}
	ranks := max(1, cfg.DataParallelSize)
	ctx, cancel := context.WithCancel(ctx)
	f := &Fleet{cancel: cancel}
	for i := 0; i < n; i++ {
		port := 0
		if basePort != 0 {
			port = basePort + i
		}
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: replica %d: %w", i, err)
		}
		rc := cfg
		if roles != nil {
			rc.Role = roles[i]
		}
		reps, err := startRanks(rc, name+"-"+strconv.Itoa(i), i, ranks)
		if err != nil {
			_ = ln.Close()
			f.Close()
			return nil, err
		}
		for _, rep := range reps {
			f.Replicas = append(f.Replicas, rep)
			f.URLs = append(f.URLs, "http://"+ln.Addr().String())
		}
		f.arrivals.add(reps...)
		h := reps[0].Handler()
		if ranks > 1 {
			h = newRankGroup(reps)
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			// A replica that stops serving early shows up as failed requests.
			_ = serve(ctx, ln, h)
		}()
	}
	return f, nil
}

// rankPortTries bounds the bases tried for the consecutive event ports of
// one server's ranks when StartFleet picks them.
const rankPortTries = 32

// startRanks starts the ranks engines of server i, named name (and
// "-dp<r>" when ranks > 1). Their event ports are cfg's plus i×ranks + r;
// where cfg leaves a port to be picked (0) and there are several ranks,
// the ranks need consecutive ones, as an engine's ranks publish on its
// configured port + r: a base is drawn below 32768 (the ephemeral range
// starts there) and tried again when one of its ports is taken.
func startRanks(cfg Config, name string, i, ranks int) ([]*Replica, error) {
	// Ports configured are the fleet's first: this server's come i×ranks on.
	if cfg.KVEventsPort > 0 {
		cfg.KVEventsPort += i * ranks
	}
	if cfg.KVEventsReplayPort > 0 {
		cfg.KVEventsReplayPort += i * ranks
	}
	pick := ranks > 1 && cfg.KVEvents && (cfg.KVEventsPort == 0 || cfg.KVEventsReplayPort == 0)
	for try := 0; ; try++ {
		c := cfg
		if pick {
			base := 20000 + rand.IntN(12000-2*ranks)
			if c.KVEventsPort == 0 {
				c.KVEventsPort = base
			}
			if c.KVEventsReplayPort == 0 {
				c.KVEventsReplayPort = base + ranks
			}
		}
		reps, err := startRankEngines(c, name, ranks)
		if err == nil || !pick || try+1 == rankPortTries {
			return reps, err
		}
	}
}

// startRankEngines is one try of startRanks: rank r's event ports are
// cfg's + r.
func startRankEngines(cfg Config, name string, ranks int) ([]*Replica, error) {
	var reps []*Replica
	for r := range ranks {
		c := cfg
		c.Name = name
		if ranks > 1 {
			c.Name += "-dp" + strconv.Itoa(r)
			c.DataParallelRank = r
		}
		if c.KVEventsPort > 0 {
			c.KVEventsPort += r
		}
		if c.KVEventsReplayPort > 0 {
			c.KVEventsReplayPort += r
		}
		rep, err := NewReplica(c)
		if err != nil {
			for _, rep := range reps {
				rep.Close()
			}
			return nil, err
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

// Close stops every replica's server (aborting open requests) and engine,
// and waits for them.
func (f *Fleet) Close() {
	f.once.Do(func() {
		f.cancel()
		f.wg.Wait()
		for _, r := range f.Replicas {
			r.Close()
		}
	})
}

// KVEvents returns where each replica publishes its KV events, in replica
// order (zero values without Config.KVEvents): what kvroute's
// backends[].kv_events of that replica names.
func (f *Fleet) KVEvents() []KVEventsEndpoint {
	out := make([]KVEventsEndpoint, len(f.Replicas))
	for i, r := range f.Replicas {
		out[i] = r.KVEventsEndpoints()
	}
	return out
}
