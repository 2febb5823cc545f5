package router

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/lru"
	"github.com/kvroute/kvroute/telemetry"
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

	mu sync.Mutex
	// The bindings, bounded by entries, in order of their last binding.
	lru lru.Cache[sessionKey, binding]
}

// sessionKey is an ID's digest.
type sessionKey [2]uint64

// binding is a session's replica and when it was bound.
type binding struct {
	rep  *backends.Replica
	seen int64 // unix nanos of the last binding
}

// SessionStats describes a session table. It is telemetry's type itself,
// so the server registers Sessions.Stats for /metrics without copying fields.
type SessionStats = telemetry.SessionStats

// NewSessions builds a session table whose bindings expire after ttl idle,
// with the default bounds (DefaultSessionMaxEntries, DefaultSessionMaxIDBytes).
func NewSessions(ttl time.Duration) *Sessions {
	s := &Sessions{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	s.lru.Init(lru.Options[binding]{Evicted: func(*binding) { s.evicted.Add(1) }})
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
	s.lru.SetBounds(maxEntries, 0)
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
	if !s.admits(id) {
		return nil
	}
	k := s.digest(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.lru.Peek(k)
	if e == nil || now.UnixNano()-e.Value.seen > s.ttl.Load() {
		return nil
	}
	return e.Value.rep
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
	var prev binding
	e := s.lru.Get(k)
	had := e != nil
	if had {
		prev = e.Value
		e.Value = binding{rep: rep, seen: seen}
	} else {
		// At the bound, the least recently bound session makes room and
		// its entry is reused.
		e = s.lru.Put(k, binding{rep: rep, seen: seen})
	}
	ttl := s.ttl.Load()
	s.lru.RemoveOldestWhile(trimPerBind, func(last *lru.Entry[sessionKey, binding]) bool {
		return last != e && seen-last.Value.seen > ttl
	})
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		cur := s.lru.Peek(k)
		if cur == nil || cur.Value.rep != rep {
			return
		}
		if had {
			cur.Value = prev
		} else {
			s.lru.Remove(cur)
		}
	}
}

// Forget drops every binding to rep.
func (s *Sessions) Forget(rep *backends.Replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lru.RemoveFunc(func(e *lru.Entry[sessionKey, binding]) bool { return e.Value.rep == rep })
}

// Len returns the number of bindings held (expired ones included until
// dropped).
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len()
}

// Stats returns the table's size, bound and counters.
func (s *Sessions) Stats() SessionStats {
	s.mu.Lock()
	n, mx := s.lru.Len(), s.lru.MaxEntries()
	s.mu.Unlock()
	return SessionStats{Entries: n, MaxEntries: mx, Rejected: s.rejected.Load(), Evicted: s.evicted.Load()}
}
