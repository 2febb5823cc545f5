package router

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// Bounds of a session table, used when NewSessions or SetLimits get none
// (see config.Session).
const (
	DefaultSessionMaxEntries = 100000
	DefaultSessionMaxIDBytes = 256
)

// SessionEntryBytes bounds the memory one binding takes, map slot and
// entry included, whatever the length of its ID: the table holds at most
// max_entries × SessionEntryBytes bytes.
const SessionEntryBytes = 160

// Sessions maps session IDs to the replica that last served them. A binding
// expires after the TTL idle, and beyond the entry bound the least recently
// bound session goes. IDs are kept as 128-bit digests (two 64-bit keyed
// hashes under seeds drawn for the table), never whole, so a binding costs
// the same whatever its ID's length; an ID longer than the ID bound is
// rejected: it counts as no session (not looked up, not bound) and is
// counted in SessionStats.Rejected. Safe for concurrent use.
type Sessions struct {
	seeds    [2]maphash.Seed
	peerKey  atomic.Pointer[PeerKey] // keys the IDs in place of seeds when set (Router.SetPeerKey)
	ttl      atomic.Int64            // nanoseconds
	maxID    atomic.Int64            // longest ID accepted, in bytes
	rejected atomic.Int64
	evicted  atomic.Int64

	mu  sync.Mutex
	max int
	m   map[sessionKey]*sessionEntry
	// The entries in order of their last binding, most recent first, in a
	// ring around root.
	root sessionEntry
}

// sessionKey is an ID's digest.
type sessionKey [2]uint64

type sessionEntry struct {
	key        sessionKey
	rep        *backends.Replica
	seen       int64 // unix nanos of the last binding
	prev, next *sessionEntry
}

// SessionStats describes a session table.
type SessionStats struct {
	Entries    int   // bindings held, expired ones not yet dropped included
	MaxEntries int   // the entry bound
	Rejected   int64 // IDs rejected for their length, since the table was built
	Evicted    int64 // bindings dropped for the entry bound, since the table was built
}

// NewSessions builds a session table whose bindings expire after ttl idle,
// with the default bounds (DefaultSessionMaxEntries, DefaultSessionMaxIDBytes).
func NewSessions(ttl time.Duration) *Sessions {
	s := &Sessions{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}, m: make(map[sessionKey]*sessionEntry)}
	s.root.prev, s.root.next = &s.root, &s.root
	s.SetTTL(ttl)
	s.SetLimits(0, 0)
	return s
}

// SetTTL changes how long an idle binding lasts.
func (s *Sessions) SetTTL(ttl time.Duration) { s.ttl.Store(int64(ttl)) }

// SetLimits changes the entry bound and the ID length bound (in bytes);
// zero or less means the default. Bindings beyond a lower entry bound are
// dropped at once, least recently bound first.
func (s *Sessions) SetLimits(maxEntries, maxIDBytes int) {
	if maxEntries <= 0 {
		maxEntries = DefaultSessionMaxEntries
	}
	if maxIDBytes <= 0 {
		maxIDBytes = DefaultSessionMaxIDBytes
	}
	s.maxID.Store(int64(maxIDBytes))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max = maxEntries
	for len(s.m) > s.max {
		s.removeLocked(s.root.prev)
		s.evicted.Add(1)
	}
}

// admit reports whether id is a session ID the table takes, counting it
// as rejected when it is too long. A nil table takes none.
func (s *Sessions) admit(id string) bool {
	if s == nil || id == "" {
		return false
	}
	if !s.admits(id) {
		s.rejected.Add(1)
		return false
	}
	return true
}

// admits is admit counting nothing.
func (s *Sessions) admits(id string) bool {
	return s != nil && id != "" && int64(len(id)) <= s.maxID.Load()
}

func (s *Sessions) digest(id string) sessionKey {
	if k := s.peerKey.Load(); k != nil {
		return sessionKeyOf(k.Digest(id))
	}
	return sessionKey{maphash.String(s.seeds[0], id), maphash.String(s.seeds[1], id)}
}

// Lookup returns the replica bound to id, or nil if none, expired, or id
// is empty or too long. It changes nothing (Router.Explain looks up too):
// an expired binding stays until Bind or the entry bound drops it.
func (s *Sessions) Lookup(id string, now time.Time) *backends.Replica {
	if id == "" || int64(len(id)) > s.maxID.Load() {
		return nil
	}
	k := s.digest(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.m[k]
	if e == nil {
		return nil
	}
	if now.UnixNano()-e.seen > s.ttl.Load() {
		return nil
	}
	return e.rep
}

// noUndo is the undo of a binding that was not recorded.
func noUndo() {}

// trimPerBind is how many expired bindings one Bind drops at most, from the
// least recently bound: enough to keep up with the bindings made, without
// a long pause under the lock.
const trimPerBind = 8

// Bind records that rep serves session id and returns an undo restoring the
// previous binding. Only id's digest is kept, in the table and in the undo.
// An empty or too long id is not bound (a too long one counts as rejected).
func (s *Sessions) Bind(id string, rep *backends.Replica, now time.Time) (undo func()) {
	if !s.admit(id) {
		return noUndo
	}
	return s.bindKey(s.digest(id), rep, now)
}

// bindKey is Bind of an ID's digest.
func (s *Sessions) bindKey(k sessionKey, rep *backends.Replica, now time.Time) (undo func()) {
	seen := now.UnixNano()
	s.mu.Lock()
	e := s.m[k]
	had := e != nil
	var prevRep *backends.Replica
	var prevSeen int64
	if had {
		prevRep, prevSeen = e.rep, e.seen
		s.unlinkLocked(e)
	} else {
		if len(s.m) >= s.max {
			// The least recently bound session makes room; its entry is
			// reused.
			e = s.root.prev
			s.removeLocked(e)
			s.evicted.Add(1)
		} else {
			e = new(sessionEntry)
		}
		e.key = k
		s.m[k] = e
	}
	e.rep, e.seen = rep, seen
	s.pushFrontLocked(e)
	ttl := s.ttl.Load()
	for i := 0; i < trimPerBind; i++ {
		last := s.root.prev
		if last == &s.root || last == e || seen-last.seen <= ttl {
			break
		}
		s.removeLocked(last)
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		cur := s.m[k]
		if cur == nil || cur.rep != rep {
			return
		}
		if had {
			cur.rep, cur.seen = prevRep, prevSeen
		} else {
			s.removeLocked(cur)
		}
	}
}

func (s *Sessions) pushFrontLocked(e *sessionEntry) {
	e.prev, e.next = &s.root, s.root.next
	s.root.next.prev = e
	s.root.next = e
}

func (s *Sessions) unlinkLocked(e *sessionEntry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (s *Sessions) removeLocked(e *sessionEntry) {
	s.unlinkLocked(e)
	e.rep = nil
	delete(s.m, e.key)
}

// Forget drops every binding to rep.
func (s *Sessions) Forget(rep *backends.Replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for e := s.root.next; e != &s.root; {
		next := e.next
		if e.rep == rep {
			s.removeLocked(e)
		}
		e = next
	}
}

// Len returns the number of bindings held (expired ones included until
// dropped).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// Stats returns the table's size, bound and counters.
func (s *Sessions) Stats() SessionStats {
	s.mu.Lock()
	n, mx := len(s.m), s.max
	s.mu.Unlock()
	return SessionStats{Entries: n, MaxEntries: mx, Rejected: s.rejected.Load(), Evicted: s.evicted.Load()}
}
