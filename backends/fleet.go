package backends

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// fleetState is one immutable version of the replica list.
type fleetState struct {
	list   []*Replica
	byName map[string]*Replica
}

func newFleetState(list []*Replica) *fleetState {
	st := &fleetState{list: list, byName: make(map[string]*Replica, len(list))}
	for _, r := range list {
		st.byName[r.name] = r
	}
	return st
}

// Fleet is the set of replicas. Reads ([Fleet.Replicas], [Fleet.ByName]) are
// lock-free; [Fleet.Start] and [Fleet.Update] are serialised. All methods are
// safe for concurrent use.
type Fleet struct {
	opts     *Options
	timeouts *readTimeouts // the proxy clients' read timeouts, shared by the replicas
	log      *zap.Logger
	state    atomic.Pointer[fleetState]

	mu    sync.Mutex // serialises Start and Update; guards ctx and taken
	ctx   context.Context
	taken []bool // taken[id] while a replica in the fleet holds id
}

// NewFleet validates specs (see [ValidateSpecs]) and opts (negative values are
// errors, zero values take their defaults) and builds the fleet with
// replicas in spec order, IDs 0..len(specs)-1. No request is made until
// [Fleet.Start] or [Fleet.CheckNow]. A nil log discards logs.
func NewFleet(specs []Spec, opts Options, log *zap.Logger) (*Fleet, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	targets, err := validateSpecs(specs)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	f := &Fleet{opts: &o, timeouts: newReadTimeouts(o.FirstByteTimeout, o.StreamIdleTimeout), log: log.Named("backends")}
	list := make([]*Replica, len(specs))
	for i, s := range specs {
		list[i] = newReplica(f.allocID(), s, targets[i], f.opts, f.timeouts, f.log)
	}
	f.state.Store(newFleetState(list))
	return f, nil
}

// Options returns the resolved options, defaults filled in, with the read
// timeouts in force (see [Fleet.SetTimeouts]).
func (f *Fleet) Options() Options {
	o := *f.opts
	o.FirstByteTimeout, o.StreamIdleTimeout = f.timeouts.get()
	return o
}

// SetTimeouts changes the read timeouts of proxied traffic,
// [Options.FirstByteTimeout] and [Options.StreamIdleTimeout], for every
// replica, current or added later, and for connections already open: each
// read uses the values current when it starts. A value <= 0 means no such
// deadline.
func (f *Fleet) SetTimeouts(firstByte, streamIdle time.Duration) {
	f.timeouts.set(max(firstByte, 0), max(streamIdle, 0))
}

// allocID returns the lowest free ID. Caller holds f.mu (or owns f).
func (f *Fleet) allocID() int {
	for id, t := range f.taken {
		if !t {
			f.taken[id] = true
			return id
		}
	}
	f.taken = append(f.taken, true)
	return len(f.taken) - 1
}

// Start starts, for every replica, a health loop and a metrics loop tied to
// ctx, each running its first round immediately. It returns once every
// replica's first health round (GET /health, then GET /v1/models when its
// spec lists no models) is over, so that the model list is filled before
// requests are served; each of the round's two requests is bounded by
// Options.HealthTimeout, and Start waits at most twice that (or until ctx
// is done). Replicas added later by [Fleet.Update] get loops too, without a
// wait. Calling Start again is a no-op. Cancelling ctx stops all loops
// (each within one check timeout).
func (f *Fleet) Start(ctx context.Context) {
	f.mu.Lock()
	if f.ctx != nil {
		f.mu.Unlock()
		f.log.Warn("fleet already started")
		return
	}
	f.ctx = ctx
	list := f.state.Load().list
	for _, r := range list {
		r.startLoops(ctx)
	}
	f.mu.Unlock()

	wait := time.NewTimer(2 * f.opts.HealthTimeout)
	defer wait.Stop()
	for i, r := range list {
		select {
		case <-r.checked:
			continue
		case <-wait.C:
		case <-ctx.Done():
			return
		}
		var late []string
		for _, r := range list[i:] {
			select {
			case <-r.checked:
			default:
				late = append(late, r.name)
			}
		}
		f.log.Warn("serving before the first health check of these replicas finished",
			zap.Strings("replicas", late), zap.Duration("waited", 2*f.opts.HealthTimeout))
		return
	}
}

// Replicas returns the current replicas in spec order. The slice is shared
// and immutable: do not modify it.
func (f *Fleet) Replicas() []*Replica { return f.state.Load().list }

// ByName returns the current replica named name, or nil.
func (f *Fleet) ByName(name string) *Replica { return f.state.Load().byName[name] }

// Models returns the sorted union of the current replicas' model lists
// ([Replica.Models]), without duplicates.
func (f *Fleet) Models() []string {
	var all []string
	for _, r := range f.state.Load().list {
		all = append(all, r.Models()...)
	}
	slices.Sort(all)
	return slices.Compact(all)
}

// Update replaces the replica list (hot reload). specs are validated first; on
// error nothing changes. A spec whose Name and URL (scheme, host, port and
// base path) match a current replica keeps that replica and all its state
// (ID, health, counters, snapshot, client and its connections); its Engine,
// Models and other settings are updated in place. So is its TLS: when its
// settings or the contents of its files changed, new connections use the
// new configuration and idle ones are closed. Other current replicas are
// removed: Update stops their loops and waits for them to return (at most
// one check timeout) before returning, then closes their idle connections;
// requests already using them finish normally. Other specs become new
// replicas with the lowest free IDs (never an ID freed by this same
// Update), with loops started if Start was called. The new list follows
// spec order.
func (f *Fleet) Update(specs []Spec) (added, removed []*Replica, err error) {
	targets, err := validateSpecs(specs)
	if err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	old := f.state.Load()
	list := make([]*Replica, len(specs))
	kept := make(map[*Replica]bool, len(specs))
	var retls []*Replica // kept replicas whose TLS configuration changed
	for i, s := range specs {
		if r := old.byName[s.Name]; r != nil && r.target.base == targets[i].base {
			r.setSpec(s)
			if r.setTLS(targets[i]) {
				retls = append(retls, r)
			}
			list[i] = r
			kept[r] = true
		}
	}
	for _, r := range old.list {
		if !kept[r] {
			removed = append(removed, r)
		}
	}
	for i, s := range specs {
		if list[i] == nil {
			list[i] = newReplica(f.allocID(), s, targets[i], f.opts, f.timeouts, f.log)
			added = append(added, list[i])
		}
	}
	for _, r := range removed {
		f.taken[r.id] = false
	}
	f.state.Store(newFleetState(list))
	if f.ctx != nil {
		for _, r := range added {
			r.startLoops(f.ctx)
		}
	}
	f.mu.Unlock()

	for _, r := range retls {
		// Idle connections go, so the next requests use the new settings;
		// those in use finish with the old ones.
		r.client.CloseIdleConnections()
		r.checks.CloseIdleConnections()
		f.log.Info("replica TLS settings or files changed; new connections use them", zap.String("replica", r.name))
	}
	for _, r := range added {
		f.log.Info("replica added", zap.String("replica", r.name), zap.String("url", r.target.base), zap.Int("id", r.id))
	}
	for _, r := range removed {
		r.retire()
		f.log.Info("replica removed", zap.String("replica", r.name), zap.String("url", r.target.base), zap.Int("id", r.id))
	}
	return added, removed, nil
}

// CheckNow runs one health round (with models fetch) and one metrics round
// for every current replica, concurrently, and returns when all are done or
// ctx is done, whichever comes first. Useful at startup and in tests; it does
// not need Start.
func (f *Fleet) CheckNow(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range f.state.Load().list {
		wg.Go(func() { r.safely("health", r.checkHealth) })
		wg.Go(func() { r.safely("metrics", r.pollMetrics) })
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
