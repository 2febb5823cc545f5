package router

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/lru"
)

// MaxResponseIDBytes bounds the length of a response id the table keeps:
// a longer one is neither recorded nor looked up.
const MaxResponseIDBytes = 256

// ResponseAffinity is the route reason of a request sent to the replica
// that stored the response it refers to.
const ResponseAffinity = "response_affinity"

// ErrResponseReplicaFailed is the error of a request whose stored response
// is held by a replica that failed the attempt: no other replica has it.
var ErrResponseReplicaFailed = errors.New("the replica holding the referenced response failed")

// Responses remembers which replica produced each stored Responses-API
// response, since an engine keeps them in its own memory: a follow-up that
// names one (previous_response_id, or /v1/responses/{id}) must go there.
// An id is forgotten ttl after its last use, and beyond maxEntries ids the
// least recently used goes. A nil *Responses records nothing and knows no
// id. It is safe for concurrent use.
type Responses struct {
	mu  sync.Mutex
	ttl time.Duration
	now func() time.Time
	// The ids (or their digests under peerKey), bounded by entries, in
	// order of last use; since every use makes an entry the most recent
	// with the current time, the expired ones are the least recent.
	lru lru.Cache[string, stored]

	sharer atomic.Pointer[sharerBox] // told of Record; nil: no one
	// peerKey, when set, keys the table by the ids' digests (PeerDigest)
	// in place of the ids (Router.SetPeerKey).
	peerKey atomic.Pointer[PeerKey]
}

// stored is the replica that stored a response, and the id's last use.
type stored struct {
	rep  *backends.Replica
	used time.Time
}

// NewResponses builds a table whose ids expire ttl after their last use,
// holding at most maxEntries of them.
func NewResponses(ttl time.Duration, maxEntries int) *Responses {
	t := &Responses{now: time.Now}
	t.lru.Init(lru.Options[stored]{})
	t.SetLimits(ttl, maxEntries)
	return t
}

// SetLimits changes the TTL and the entry bound, dropping at once what no
// longer fits. A maxEntries below 1 counts as 1.
func (t *Responses) SetLimits(ttl time.Duration, maxEntries int) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ttl = ttl
	t.lru.SetBounds(max(maxEntries, 1), 0)
	t.trimLocked(t.now())
}

// Record notes that rep stored the response id (copied: id may alias a
// buffer), and tells the Router's Sharer (see Router.SetSharer). An empty
// id, or one longer than MaxResponseIDBytes, is ignored.
func (t *Responses) Record(id string, rep *backends.Replica) {
	if t == nil || rep == nil || id == "" || len(id) > MaxResponseIDBytes {
		return
	}
	if b := t.sharer.Load(); b != nil {
		b.s.Stored(id, rep)
	}
	t.put(id, rep)
}

// setSharer makes Record tell s (nil: no one).
func (t *Responses) setSharer(s Sharer) {
	if t == nil {
		return
	}
	if s == nil {
		t.sharer.Store(nil)
	} else {
		t.sharer.Store(&sharerBox{s})
	}
}

// mapKey is id's key in the table: id itself, or its digest under the
// peer key.
func (t *Responses) mapKey(id string) string {
	if k := t.peerKey.Load(); k != nil {
		d := k.Digest(id)
		return string(d[:])
	}
	return id
}

// put is Record without telling the Sharer.
func (t *Responses) put(id string, rep *backends.Replica) {
	if t == nil || rep == nil || id == "" || len(id) > MaxResponseIDBytes {
		return
	}
	t.putKey(t.mapKey(id), rep)
}

// putKey records that rep stored the response of table key id.
func (t *Responses) putKey(id string, rep *backends.Replica) {
	if t == nil || rep == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if e := t.lru.Get(id); e != nil {
		e.Value = stored{rep, now}
	} else {
		t.lru.Put(strings.Clone(id), stored{rep, now})
	}
	t.trimLocked(now)
}

// Lookup returns the replica that stored id, or nil when id is unknown or
// expired; a hit counts as a use.
func (t *Responses) Lookup(id string) *backends.Replica {
	if t == nil || id == "" || len(id) > MaxResponseIDBytes {
		return nil
	}
	id = t.mapKey(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.lru.Peek(id)
	if e == nil {
		return nil
	}
	now := t.now()
	if now.Sub(e.Value.used) >= t.ttl {
		t.lru.Remove(e)
		return nil
	}
	e.Value.used = now
	t.lru.Touch(e)
	return e.Value.rep
}

// Remove forgets id (the response was deleted).
func (t *Responses) Remove(id string) {
	if t == nil || id == "" || len(id) > MaxResponseIDBytes {
		return
	}
	id = t.mapKey(id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.lru.Peek(id); e != nil {
		t.lru.Remove(e)
	}
}

// Forget drops every id stored by rep, a replica that left the fleet.
func (t *Responses) Forget(rep *backends.Replica) {
	if t == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lru.RemoveFunc(func(e *lru.Entry[string, stored]) bool { return e.Value.rep == rep })
}

// Len returns the number of ids held, expired ones not yet dropped included.
func (t *Responses) Len() int {
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

// trimLocked drops the expired entries, from the least recently used
// (the entry bound is the Cache's).
func (t *Responses) trimLocked(now time.Time) {
	t.lru.RemoveOldestWhile(-1, func(e *lru.Entry[string, stored]) bool { return now.Sub(e.Value.used) >= t.ttl })
}

// SetResponses gives the router its table of stored responses (nil: none).
func (r *Router) SetResponses(t *Responses) {
	if b := r.sharer.Load(); b != nil {
		t.setSharer(b.s)
	}
	if old := r.Responses(); old != nil && t != nil {
		t.peerKey.Store(old.peerKey.Load())
	}
	r.responses.Store(t)
}

// Responses returns the router's table of stored responses, possibly nil
// (whose methods do nothing).
func (r *Router) Responses() *Responses { return r.responses.Load() }

// pinned returns the decision for a request that refers to the stored
// response id, which the replica that stored it must answer: that replica
// when it is still in the fleet, available and serving model (backup or
// not). When it was tried already (in exclude) the request fails with
// ErrResponseReplicaFailed rather than go to a replica that lacks the
// response. ok is false when the policy decides as for any request: the id
// is unknown, or its replica is out of service, removed or not serving
// model.
func (r *Router) pinned(id, model string, exclude []*backends.Replica) (_ Decision, ok bool, _ error) {
	rep := r.Responses().Lookup(id)
	if rep == nil {
		return Decision{}, false, nil
	}
	if tried(rep, exclude) {
		return Decision{}, true, ErrResponseReplicaFailed
	}
	// The replica that holds the response is the one to ask even when it
	// is a backup and primaries are back, or its pool is full (the attempt
	// waits for a connection): no other replica has it.
	if !Available(rep, true) || model != "" && !rep.Serves(model) || !slices.Contains(r.fleet.Replicas(), rep) {
		return Decision{}, false, nil
	}
	return Decision{Replica: rep, Reason: ResponseAffinity, Pinned: true}, true, nil
}

// NextFor is Next for a request that refers to the stored response id (a
// GET, DELETE or cancel of /v1/responses/{id}): the replica that stored it,
// while it is in the fleet and available; else, or for an empty id, Next.
// Once that replica was tried (in exclude), the request fails with
// ErrResponseReplicaFailed: no other replica has the response.
func (r *Router) NextFor(id string, exclude []*backends.Replica) (Decision, error) {
	return r.nextFor(id, exclude, false)
}

// PassThrough is NextFor for req, a request not routed by prompt: the
// replica that stored req.ResponseID, else Next, where a replica whose
// connection pool is full is a candidate only with req.PoolWait.
func (r *Router) PassThrough(req *Request, exclude []*backends.Replica) (Decision, error) {
	return r.nextFor(req.ResponseID, exclude, req.PoolWait)
}

func (r *Router) nextFor(id string, exclude []*backends.Replica, poolWait bool) (Decision, error) {
	if id != "" {
		if dec, ok, err := r.pinned(id, "", exclude); ok {
			return dec, err
		}
	}
	return r.next(exclude, poolWait)
}
