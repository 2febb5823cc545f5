package router

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// PeerDigest is what the routers of a cluster share in place of a session
// ID or a stored response id: the first 16 bytes of its HMAC-SHA256 under
// the cluster's key (PeerKey). A router given the key (SetPeerKey) keeps
// its sessions and response ids by these digests, so that a peer's digest
// applies as it comes.
type PeerDigest [16]byte

// PeerKey digests ids under a cluster's key. Safe for concurrent use.
type PeerKey struct {
	pool sync.Pool // of *peerHasher
}

// peerHasher is an HMAC-SHA256 under the key with room for an id's bytes
// and the sum, so that a digest allocates nothing.
type peerHasher struct {
	h   hash.Hash
	buf []byte
	sum [sha256.Size]byte
}

// NewPeerKey returns the digester of key (copied).
func NewPeerKey(key []byte) *PeerKey {
	k := append([]byte(nil), key...)
	return &PeerKey{pool: sync.Pool{New: func() any { return &peerHasher{h: hmac.New(sha256.New, k)} }}}
}

// Digest returns id's digest.
func (k *PeerKey) Digest(id string) PeerDigest {
	ph := k.pool.Get().(*peerHasher) //nolint:forcetypeassert // the pool holds only these
	ph.h.Reset()
	ph.buf = append(ph.buf[:0], id...)
	_, _ = ph.h.Write(ph.buf)
	var d PeerDigest
	copy(d[:], ph.h.Sum(ph.sum[:0]))
	k.pool.Put(ph)
	return d
}

// sessionKeyOf is a digest as a session table's key.
func sessionKeyOf(d PeerDigest) sessionKey {
	return sessionKey{binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:])}
}

// SetPeerKey makes the router keep its session bindings and stored
// response ids by their digests under k (nil: by its own seeds and the ids
// themselves), from now on: set it before the router serves, as bindings
// made before are no longer found.
func (r *Router) SetPeerKey(k *PeerKey) {
	if s := r.Sessions(); s != nil {
		s.peerKey.Store(k)
	}
	if t := r.Responses(); t != nil {
		t.peerKey.Store(k)
	}
}

// PeerBound records another router's binding of a session, by its digest,
// to rep.
func (r *Router) PeerBound(session PeerDigest, rep *backends.Replica, at time.Time) {
	if s := r.Sessions(); s != nil {
		s.bindKey(sessionKeyOf(session), rep, at)
	}
}

// PeerStored records that rep stored a response id, by its digest, as
// another router saw it.
func (r *Router) PeerStored(id PeerDigest, rep *backends.Replica) {
	r.Responses().putKey(string(id[:]), rep)
}
