package router

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/radix"
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
//
// With req.LocalPrefill, a candidate that holds all of the prompt but at
// most that many tokens, and whose decodeLoad is within the same bound,
// comes first: it computes the rest itself (localDecode).
func (r *Router) routeDecode(req *Request, cands []*backends.Replica) Decision {
	s := r.Sessions()
	now := time.Now()
	dec := pickDecode(cands)
	if local, ok := r.localDecode(req, cands, decodeLoad(dec.Replica, now), now); ok {
		dec = local
	}
	if s == nil || req.Session == "" {
		return dec
	}
	key := decodeSessionPrefix + req.Session
	if rep := s.Lookup(key, now); !dec.Local && rep != nil && rep != dec.Replica && slices.Contains(cands, rep) &&
		decodeLoad(rep, now) <= decodeLoad(dec.Replica, now)+1 {
		dec = Decision{Replica: rep, Reason: SessionName} // as every session pick reads
	}
	dec.rec.session = s.Bind(key, dec.Replica, now)
	return dec
}

// LocalReason is the Reason of a decode replica chosen to compute the
// prompt itself (Decision.Local), followed by the tokens it holds.
const LocalReason = "decode_local"

// localDecode finds the candidate that holds the most of req's prompt
// (by the Index's approximate key, in whole engine blocks) with at most
// req.LocalPrefill tokens of it left to compute, among those whose
// decodeLoad is at most least + 1, least being the least loaded
// candidate's; of those holding as much, the least loaded, ties drawn at
// random (a prefix every prompt starts with is held everywhere). A
// prompt of which the decode replica misses only a few tokens (a
// conversation's next turn, where its earlier turns were decoded) is
// computed faster there than prefilled elsewhere and sent over, and it
// leaves the prefill replicas to prompts that need them. ok is false
// when no candidate qualifies, or without a routing key or an Index.
func (r *Router) localDecode(req *Request, cands []*backends.Replica, least float64, now time.Time) (dec Decision, ok bool) {
	ix := r.Index()
	if req.LocalPrefill <= 0 || len(req.Key) == 0 || ix == nil {
		return Decision{}, false
	}
	v := ix.View(now)
	mp := matchPool.Get().(*[]radix.Match)
	defer matchPool.Put(mp)
	*mp = v.Match((*mp)[:0], req.Key, false)
	prompt := promptTokens(req, v.KeyBlock())
	var (
		rank              ranked
		best, bestHeld    int
		bestLoad, loadCap = 0.0, least + 1
		chosen            *backends.Replica
	)
	for _, m := range *mp {
		i := slices.IndexFunc(cands, func(c *backends.Replica) bool { return c.ID() == int(m.Replica) })
		if i < 0 {
			continue
		}
		_, _, _, bs, _ := replicaState(cands[i], now, v.BlockSize())
		held := matchTokens(m.Tokens, bs)
		best = max(best, held)
		load := decodeLoad(cands[i], now)
		if held == 0 || prompt-held > req.LocalPrefill || load > loadCap {
			continue
		}
		// More of the prompt held first, then the lower load; ties drawn.
		rank.offer(i, cmp.Or(cmp.Compare(bestHeld, held), cmp.Compare(load, bestLoad)))
		if rank.best == i {
			chosen, bestHeld, bestLoad = cands[i], held, load
		}
	}
	if chosen == nil {
		return Decision{}, false
	}
	dec = Decision{Replica: chosen, Matched: bestHeld, Best: best, Local: true}
	dec.Reason = LocalReason + " matched=" + strconv.Itoa(bestHeld)
	// Recorded at once, as a policy's pick: Undo takes it back, and
	// Feedback trims what the engine turns out to have evicted.
	dec.rec.place = ix.RouterWriter().PlaceOwned(req.Key, req.keyBuf.owner(), false, chosen, now)
	return dec, true
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
// both), or when req.LocalPrefill lets a decode replica compute a prompt:
// a later request sharing the prefix may then be prefilled where its KV
// already is, and the policy (or localDecode, which records its own
// choices when it makes them) finds it there. Otherwise a decode-only replica is never
// asked to compute a prompt, so nothing is recorded for it; nor without a
// routing key or an Index.
func (r *Router) Received(req *Request, rep *backends.Replica) {
	if !rep.Prefills() && req.LocalPrefill <= 0 || len(req.Key) == 0 {
		return
	}
	if ix := r.Index(); ix != nil {
		ix.RouterWriter().Place(req.Key, false, rep, time.Now())
	}
}
