package router

import (
	"cmp"
	"sync"

	"github.com/kvroute/kvroute/backends"
)

// roundRobinModule registers round_robin.
var roundRobinModule = Module[NoConfig]{
	Name:    RoundRobinName,
	Summary: "nginx's default: smooth weighted round-robin (weights 3 and 1 give a, a, b, a, …); in a disaggregated fleet on both legs, each with its own rotation",
	New:     func(Deps, *Live[NoConfig]) Policy { return &RoundRobin{} },
}

// RoundRobin is nginx's default balancing: smooth weighted round-robin over
// the candidates (see wrr). With equal weights it cycles through them in
// order; with weights 3 and 1 it picks a, a, b, a and repeats. In a
// disaggregated fleet it rotates the decode side too (PickDecode), as
// nginx in front of each pool would: pairs drawn, not chosen.
type RoundRobin struct{ wrr, decode wrr }

// Name implements Policy.
func (*RoundRobin) Name() string { return RoundRobinName }

// Pick implements Policy.
func (p *RoundRobin) Pick(_ *Request, cands []*backends.Replica) Decision {
	return Decision{Replica: p.wrr.pick(cands), Reason: RoundRobinName}
}

// PickDecode implements DecodePicker: the decode side's own rotation.
func (p *RoundRobin) PickDecode(_ *Request, cands []*backends.Replica) Decision {
	return Decision{Replica: p.decode.pick(cands), Reason: RoundRobinName}
}

// Explain implements Explainer: the candidate Pick would choose, the
// rotation left where it is.
func (p *RoundRobin) Explain(_ *Request, cands []*backends.Replica) (Decision, []Score) {
	return Decision{Replica: p.wrr.peek(cands), Reason: RoundRobinName}, nil
}

// Forget drops the round-robin state of a replica that left the fleet.
func (p *RoundRobin) Forget(rep *backends.Replica) {
	p.wrr.forget(rep)
	p.decode.forget(rep)
}

// wrr is nginx's smooth weighted round-robin. Each replica has a current
// weight; every pick adds each candidate's weight to its current weight,
// chooses the candidate with the highest (the first among equals) and
// subtracts from it the candidates' total weight. Over any run of picks
// with the same candidates each gets its weight's share, spread out rather
// than in bursts. Replicas that are not candidates for a pick (ejected,
// already tried, backups while a primary is available) keep their current
// weight unchanged, as nginx skips its down and tried peers. The zero value
// is ready to use; it is safe for concurrent use.
type wrr struct {
	mu    sync.Mutex
	peers []wrrPeer // by replica ID
}

// wrrPeer is the current weight of the replica that holds an ID. rep tells
// a replica that reused the ID of a removed one, whose state then starts
// afresh.
type wrrPeer struct {
	rep *backends.Replica
	cur float64
}

func (s *wrr) pick(cands []*backends.Replica) *backends.Replica {
	if len(cands) == 1 {
		// Adding the one weight and subtracting the total changes nothing.
		return cands[0]
	}
	maxID := 0
	for _, c := range cands {
		maxID = max(maxID, c.ID())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.peers) <= maxID {
		s.peers = append(s.peers, make([]wrrPeer, maxID+1-len(s.peers))...)
	}
	var total float64
	var best *wrrPeer
	for _, c := range cands {
		p := &s.peers[c.ID()]
		if p.rep != c {
			*p = wrrPeer{rep: c}
		}
		w := c.Weight()
		p.cur += w
		total += w
		if best == nil || p.cur > best.cur {
			best = p
		}
	}
	best.cur -= total
	return best.rep
}

// peek returns the candidate pick would return, changing no current
// weight.
func (s *wrr) peek(cands []*backends.Replica) *backends.Replica {
	if len(cands) == 1 {
		return cands[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *backends.Replica
	var bestCur float64
	for _, c := range cands {
		cur := c.Weight()
		if id := c.ID(); id < len(s.peers) && s.peers[id].rep == c {
			cur += s.peers[id].cur
		}
		if best == nil || cur > bestCur {
			best, bestCur = c, cur
		}
	}
	return best
}

// forget clears rep's state so that it is not kept alive.
func (s *wrr) forget(rep *backends.Replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id := rep.ID(); id < len(s.peers) && s.peers[id].rep == rep {
		s.peers[id] = wrrPeer{}
	}
}

// leastLoadModule registers least_load.
var leastLoadModule = Module[NoConfig]{
	Name:    LeastLoadName,
	Summary: "fewest requests in flight through kvroute per unit of `weight`, ties at random",
	New:     func(Deps, *Live[NoConfig]) Policy { return LeastLoad{} },
}

// LeastLoad picks the candidate with the fewest requests in flight through
// this router per unit of weight, ties broken at random.
type LeastLoad struct{}

// Name implements Policy.
func (LeastLoad) Name() string { return LeastLoadName }

// Pick implements Policy.
func (LeastLoad) Pick(_ *Request, cands []*backends.Replica) Decision {
	return Decision{Replica: leastInFlight(cands), Reason: LeastLoadName}
}

// Explain implements Explainer: Pick, which records nothing. Ties are
// broken at random, so a Pick after it may choose another of them.
func (p LeastLoad) Explain(req *Request, cands []*backends.Replica) (Decision, []Score) {
	return p.Pick(req, cands), nil
}

// leastInFlight returns the candidate with the lowest in-flight requests per
// unit of weight (as nginx's least_conn compares conns/weight), choosing
// uniformly at random among ties.
func leastInFlight(cands []*backends.Replica) *backends.Replica {
	var r ranked
	var bestLoad, bestW float64
	for i, c := range cands {
		l, w := float64(c.Load()), c.Weight()
		// l/w against the best's, multiplied out: both weights are positive.
		r.offer(i, cmp.Compare(l*bestW, bestLoad*w))
		if r.best == i {
			bestLoad, bestW = l, w
		}
	}
	return cands[r.best]
}
