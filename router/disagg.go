package router

import (
	"cmp"
	"slices"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// DecodeReason is the Reason of a decode replica's Decision.
const DecodeReason = "decode_load"

// decodeKVWeight is how many requests in flight a full KV cache counts as
// in a decode replica's load (decodeLoad): decode is bound by memory, and
// an engine whose cache is full preempts running requests, so of two
// replicas with the same requests in flight the one with more free KV
// cache takes the next.
const decodeKVWeight = 4

// onLeg reports whether rep may serve leg of a disaggregated request:
// prefill or both replicas the prefill side (RolePrefill), decode or both
// replicas the decode side (RoleDecode). Every replica serves "", a whole
// request.
func onLeg(rep *backends.Replica, leg backends.Role) bool {
	switch leg {
	case backends.RolePrefill:
		return rep.Prefills()
	case backends.RoleDecode:
		return rep.Decodes()
	}
	return true
}

// decodeLoad is a decode candidate's load: the requests in flight to it
// (through every router of the cluster) and waiting in its engine, per
// unit of weight, plus decodeKVWeight times its KV cache's used fraction
// when its metrics are fresh.
func decodeLoad(c *backends.Replica, now time.Time) float64 {
	load := float64(c.Load())
	kv := 0.0
	if s, fresh := c.SnapshotAt(now); fresh && s != nil {
		load += s.Waiting
		kv = s.KVUsage
	}
	return load/c.Weight() + decodeKVWeight*kv
}

// decodeSessionPrefix keys a session's decode replica in the session
// table, apart from the replica its requests are prefilled on (which a
// policy may bind under the session's own ID).
const decodeSessionPrefix = "decode\x00"

// routeDecode chooses the decode side of a disaggregated request: the
// replica its session decoded on last (whose cache holds the session's
// transferred prefix), while it is a candidate and its decodeLoad is at
// most the least loaded candidate's plus one (a decode step's time grows
// with its batch, and a kept session saves only the transfer of what the
// replica holds already); else pickDecode,
// binding the session to the choice.
func (r *Router) routeDecode(req *Request, cands []*backends.Replica) Decision {
	s := r.Sessions()
	if s == nil || req.Session == "" {
		return pickDecode(cands)
	}
	now := time.Now()
	key := decodeSessionPrefix + req.Session
	dec := pickDecode(cands)
	if rep := s.Lookup(key, now); rep != nil && rep != dec.Replica && slices.Contains(cands, rep) &&
		decodeLoad(rep, now) <= decodeLoad(dec.Replica, now)+1 {
		dec = Decision{Replica: rep, Reason: SessionName} // as every session pick reads
	}
	dec.rec.session = s.Bind(key, dec.Replica, now)
	return dec
}

// pickDecode chooses the decode side of a disaggregated request: the
// candidate with the lowest decodeLoad, ties at random. It records
// nothing: the prompt's prefix is placed where it is prefilled.
func pickDecode(cands []*backends.Replica) Decision {
	var r ranked
	best, now := 0.0, time.Now()
	for i, c := range cands {
		l := decodeLoad(c, now)
		r.offer(i, cmp.Compare(l, best))
		if r.best == i {
			best = l
		}
	}
	return Decision{Replica: cands[r.best], Reason: DecodeReason}
}

// Received records that rep now holds req's prompt because it received
// the prompt's KV cache to decode it (vLLM's connectors pull the blocks
// into the decode engine's prefix cache), when rep also prefills (role
// both): a later request sharing the prefix may then be prefilled where
// its KV already is, and the policy finds it there. A decode-only
// replica is never a prefill candidate, so nothing is recorded for it;
// nor without a routing key or an Index.
func (r *Router) Received(req *Request, rep *backends.Replica) {
	if !rep.Prefills() || len(req.Key) == 0 {
		return
	}
	if ix := r.Index(); ix != nil {
		ix.RouterWriter().Place(req.Key, false, rep, time.Now())
	}
}
