package sim

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// Fleet is a set of replicas served on 127.0.0.1.
type Fleet struct {
	// Replicas are the replicas, in port order.
	Replicas []*Replica
	// URLs are their base URLs ("http://127.0.0.1:port"), same order.
	URLs []string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// StartFleet starts n replicas configured by cfg on 127.0.0.1:basePort ..
// basePort+n-1, or on random free ports when basePort is 0. Replica i is
// named cfg.Name+"-i" ("sim-i" by default); with cfg.KVEvents it publishes
// on cfg.KVEventsPort+i and replays on cfg.KVEventsReplayPort+i (free
// ports where those are 0; see KVEvents). The fleet stops when ctx ends or
// Close is called.
func StartFleet(ctx context.Context, n int, basePort int, cfg Config) (*Fleet, error) {
	if n <= 0 {
		return nil, fmt.Errorf("sim: fleet of %d replicas", n)
	}
	name := cfg.Name
	if name == "" {
		name = "sim"
	}
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
		c := cfg
		c.Name = name + "-" + strconv.Itoa(i)
		if c.KVEventsPort > 0 {
			c.KVEventsPort += i
		}
		if c.KVEventsReplayPort > 0 {
			c.KVEventsReplayPort += i
		}
		rep, err := NewReplica(c)
		if err != nil {
			_ = ln.Close()
			f.Close()
			return nil, err
		}
		f.Replicas = append(f.Replicas, rep)
		f.URLs = append(f.URLs, "http://"+ln.Addr().String())
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			// A replica that stops serving early shows up as failed requests.
			_ = rep.Serve(ctx, ln)
		}()
	}
	return f, nil
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
