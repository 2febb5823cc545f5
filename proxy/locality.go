package proxy

import (
	"slices"
	"time"

	"github.com/kvroute/kvroute/backends"
)

// Late binding that keeps locality (FlowOptions.LocalityWait). When room
// frees on one replica while the queue holds requests, the request at the
// head of a flow may have its prefix on another, saturated replica: sent
// to the room, it prefills its whole prompt again and the holder's copy
// goes cold. So the dispatcher looks at up to localityAhead requests of
// each flow, oldest first, and lets the first go whose prefix is not held
// better elsewhere; a request waits for its holder while a saturated
// replica holds at least localityMinTokens of its prompt and more than
// twice what any replica with room holds, for at most LocalityWait since
// it was queued. Its younger neighbours take the room meanwhile.

// localityAhead is how many requests of a flow the dispatcher considers.
const localityAhead = 32

// localityMinTokens is the least prefix worth waiting for its holder.
const localityMinTokens = 512

// locality is one dispatch round's view of the requests' holders.
type locality struct {
	p    *Proxy
	wait time.Duration
	now  time.Time
	held []int32 // scratch: tokens held by replica ID
}

func (p *Proxy) newLocality(fo *FlowOptions) *locality {
	return &locality{p: p, wait: fo.LocalityWait, now: time.Now()}
}

// waitsForHolder reports whether fr waits for the saturated replica that
// holds its prefix, crowded being the saturated replicas of its leg.
func (l *locality) waitsForHolder(fr *flowRequest, crowded []*backends.Replica) bool {
	if l.wait <= 0 || len(crowded) == 0 || l.now.Sub(fr.queued) >= l.wait || fr.rreq.Leg != "" {
		return false
	}
	l.held = l.p.router.Held(fr.rreq, l.held[:0])
	best, bestFree := int32(0), int32(0)
	for id, n := range l.held {
		if slices.ContainsFunc(crowded, func(r *backends.Replica) bool { return r.ID() == id }) {
			best = max(best, n)
		} else {
			bestFree = max(bestFree, n)
		}
	}
	return best >= localityMinTokens && best > 2*bestFree
}
