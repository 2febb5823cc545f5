package router

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
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
// With req.LocalPrefill, a candidate may compute the prompt itself
// (localDecode): one that holds all of it but at most Tokens, or, while
// the prefill replicas are Backlog behind, one that would be done sooner.
func (r *Router) routeDecode(req *Request, cands []*backends.Replica) Decision {
	s := r.Sessions()
	now := time.Now()
	var v *index.View
	if ix := r.Index(); ix != nil {
		view := ix.View(now)
		v = &view
	}
	dec := pickDecode(cands, v, now)
	if local, ok := r.localDecode(req, cands, v, decodeLoad(dec.Replica, now), now); ok {
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

// LocalPrefill says when a decode replica computes a prompt itself
// (Request.LocalPrefill). Tokens and Backlog are in prompt tokens, 0
// turning each off.
type LocalPrefill struct {
	// Tokens: a decode replica believed to hold all of the prompt but at
	// most this many tokens (a conversation's earlier turns, whose KV it
	// received or computed) computes the rest.
	Tokens int
	// Backlog: while every prefill candidate has at least this many
	// prompt tokens waiting for their prefill (sent by this router and,
	// as they report them, its cluster's peers; per unit of weight), a
	// decode replica computing no prompt of its own takes one whose
	// prefill it would finish sooner: its missing tokens fewer than the
	// least behind prefill replica's backlog and missing tokens together.
	// Each such prompt's prefill takes steps of the replica's decode
	// batch: it trades time per output token for the time to the first
	// one when the prefill replicas are too few.
	Backlog int
	// MaxRunning bounds that trade: with Backlog, a decode replica takes
	// a prompt only while it has fewer than this many requests in flight
	// and its engine reports fewer running and waiting (fewRunning), so
	// that few decodes share steps with the prompt's prefill. 0: any
	// number.
	MaxRunning int
}

// On reports whether any limit is set.
func (l LocalPrefill) On() bool { return l.Tokens > 0 || l.Backlog > 0 }

// Reasons of a decode replica chosen to compute the prompt itself
// (Decision.Local), each followed by the tokens it holds: it holds all of
// the prompt but LocalPrefill.Tokens (LocalReason), or the prefill
// replicas are LocalPrefill.Backlog behind (BacklogReason).
const (
	LocalReason   = "decode_local"
	BacklogReason = "decode_backlog"
)

// localDecode finds the candidate that holds the most of req's prompt
// (by the Index's approximate key, in whole engine blocks) with at most
// req.LocalPrefill.Tokens of it left to compute, among those whose
// decodeLoad is at most least + 1, least being the least loaded
// candidate's; of those holding as much, the least loaded, ties drawn at
// random (a prefix every prompt starts with is held everywhere). A
// prompt of which the decode replica misses only a few tokens (a
// conversation's next turn, where its earlier turns were decoded) is
// computed faster there than prefilled elsewhere and sent over, and it
// leaves the prefill replicas to prompts that need them. Failing that,
// the candidate relieve finds while the prefill replicas are behind. ok
// is false when no candidate qualifies, or without a routing key or an
// Index.
func (r *Router) localDecode(req *Request, cands []*backends.Replica, v *index.View, least float64, now time.Time) (dec Decision, ok bool) {
	ix := r.Index()
	if !req.LocalPrefill.On() || req.Prefilled || len(req.Key) == 0 || ix == nil || v == nil {
		return Decision{}, false
	}
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
		if held == 0 || req.LocalPrefill.Tokens <= 0 || prompt-held > req.LocalPrefill.Tokens || load > loadCap {
			continue
		}
		// More of the prompt held first, then the lower load; ties drawn.
		rank.offer(i, cmp.Or(cmp.Compare(bestHeld, held), cmp.Compare(load, bestLoad)))
		if rank.best == i {
			chosen, bestHeld, bestLoad = cands[i], held, load
		}
	}
	reason := LocalReason
	if chosen == nil && req.LocalPrefill.Backlog > 0 {
		var prefillHeld int
		chosen, bestHeld, prefillHeld = r.relieve(req, cands, v, *mp, prompt, loadCap, now)
		best, reason = max(best, prefillHeld), BacklogReason
	}
	if chosen == nil {
		return Decision{}, false
	}
	dec = Decision{Replica: chosen, Matched: bestHeld, Best: best, Local: true}
	dec.Reason = reason + " matched=" + strconv.Itoa(bestHeld)
	// Recorded at once, as a policy's pick: Undo takes it back, and
	// Feedback trims what the engine turns out to have evicted. The
	// tokens it computes are pending there until it answers (relieve).
	w := ix.RouterWriter()
	dec.rec.place = w.PlaceOwned(req.Key, req.keyBuf.owner(), false, chosen, now)
	dec.rec.pending = w.AddPending(chosen, int64(max(prompt-bestHeld, 0)))
	return dec, true
}

// relieve finds a decode candidate to compute req's prompt while the
// prefill replicas are behind (LocalPrefill.Backlog): among those computing
// no prompt of their own (nothing pending there: index.View.Pending, this
// router's and its peers'), whose decodeLoad is at most loadCap and which
// run few enough requests (fewRunning), the least loaded (the fewer decodes
// its prefill stalls), then the one with the fewest of the prompt's tokens
// left to compute, ties drawn, if those are fewer than the prefill side's:
// the least, over the prefill candidates, of the tokens pending there plus
// the prompt's tokens left to compute there, both per unit of weight. It
// returns nil when some prefill candidate has fewer than Backlog tokens
// pending per unit of weight; with no prefill candidate at all (every one
// down or its pool full), any qualifies. ms are the prompt's matches in v.
// It returns the tokens the chosen replica holds and the most any prefill
// candidate holds.
func (r *Router) relieve(req *Request, cands []*backends.Replica, v *index.View, ms []radix.Match, prompt int, loadCap float64, now time.Time) (chosen *backends.Replica, held, prefillHeld int) {
	bp := candPool.Get().(*[]*backends.Replica)
	pre, _ := r.candidates((*bp)[:0], req.Model, backends.RolePrefill, nil, false)
	defer func() {
		clear(pre)
		*bp = pre[:0]
		candPool.Put(bp)
	}()
	remote := math.Inf(1)
	for _, p := range pre {
		pending := float64(v.Pending(p)) / p.Weight()
		if pending < float64(req.LocalPrefill.Backlog) {
			return nil, 0, 0
		}
		h := heldBy(p, ms, v, now)
		prefillHeld = max(prefillHeld, h)
		remote = min(remote, pending+float64(prompt-h)/p.Weight())
	}
	var (
		rank               ranked
		bestCost, bestLoad = remote, 0.0
	)
	for i, d := range cands {
		load := decodeLoad(d, now)
		if v.Pending(d) > 0 || load > loadCap || !fewRunning(d, req.LocalPrefill.MaxRunning, now) {
			continue
		}
		h := heldBy(d, ms, v, now)
		cost := float64(prompt-h) / d.Weight()
		if cost >= remote {
			continue
		}
		// The lower load first (the fewer decodes its prefill stalls),
		// then fewer tokens to compute; ties drawn.
		rank.offer(i, cmp.Or(cmp.Compare(load, bestLoad), cmp.Compare(cost, bestCost)))
		if rank.best == i {
			chosen, held, bestCost, bestLoad = d, h, cost, load
		}
	}
	return chosen, held, prefillHeld
}

// fewRunning reports whether c has fewer than limit requests in flight
// to it (through every router of the cluster) and, by its engine's fresh
// metrics, running and waiting (LocalPrefill.MaxRunning); always with
// limit 0. The metrics miss what arrived since their scrape; the count in
// flight misses requests of other clients.
func fewRunning(c *backends.Replica, limit int, now time.Time) bool {
	if limit <= 0 {
		return true
	}
	s, fresh := c.SnapshotAt(now)
	return c.Load() < int64(limit) && fresh && s != nil && s.Running+s.Waiting < float64(limit)
}

// heldBy is how many of the prompt's tokens c holds in whole engine
// blocks, by the prompt's matches ms in v.
func heldBy(c *backends.Replica, ms []radix.Match, v *index.View, now time.Time) int {
	for _, m := range ms {
		if int(m.Replica) == c.ID() {
			_, _, _, bs, _ := replicaState(c, now, v.BlockSize())
			return matchTokens(m.Tokens, bs)
		}
	}
	return 0
}

// pickDecode chooses the decode side of a disaggregated request: the
// candidate with the lowest decodeLoad, ties at random, where one
// computing a prompt (tokens pending there: LocalPrefill) counts
// decodeComputing requests more. It records nothing: the prompt's prefix
// is placed where it is prefilled.
func pickDecode(cands []*backends.Replica, v *index.View, now time.Time) Decision {
	var rank ranked
	best := 0.0
	for i, c := range cands {
		l := decodeLoad(c, now)
		if v != nil && v.Pending(c) > 0 {
			l += decodeComputing
		}
		rank.offer(i, cmp.Compare(l, best))
		if rank.best == i {
			best = l
		}
	}
	return Decision{Replica: cands[rank.best], Reason: DecodeReason}
}

// decodeComputing is how many requests in flight a decode replica
// computing a prompt counts as more in pickDecode: a decode step costs
// little more for one more request in its batch, and a prefill chunk in
// it stalls every decode there for the chunk's time.
const decodeComputing = 4

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
	if !rep.Prefills() && !req.LocalPrefill.On() || len(req.Key) == 0 {
		return
	}
	if ix := r.Index(); ix != nil {
		ix.RouterWriter().Place(req.Key, false, rep, time.Now())
	}
}
