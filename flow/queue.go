package flow

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// QueueLimits bounds a Queue. The zero value is no queue at all: every
// Push is refused.
type QueueLimits struct {
	// MaxQueued is the number of requests that may wait at once; 0 (or
	// less) means no queue: every Push is refused with ErrQueueFull.
	MaxQueued int
	// MaxQueuedBytes bounds the sum of Item.Bytes waiting at once; 0 (or
	// less) means no byte bound.
	MaxQueuedBytes int64
	// MaxWait is the longest a request waits in Wait before ErrTimeout;
	// 0 (or less) means no bound.
	MaxWait time.Duration
}

// Item is one request in a Queue. The caller fills the exported fields
// before Push and must not share the Item between two Pushes at once; an
// Item may be pushed again once the Wait for its previous Push has
// returned (or, if nobody waits on it, once it has left the queue).
type Item struct {
	// Priority is the band: a lower value is served first, as vLLM's
	// priority field (band 0 before band 1, a negative band before 0).
	Priority int
	// Flow is the fairness key (the tenant): the flows of a band are
	// served round-robin, each flow first in, first out.
	Flow string
	// Bytes is the request's size, counted against
	// QueueLimits.MaxQueuedBytes; a negative value counts as 0.
	Bytes int64
	// Value is the caller's (for instance the model, for the ready func
	// of Dispatch); the queue never reads it.
	Value any

	// Guarded by the Queue's lock. Priority, Flow and Bytes are read
	// once, at Push: size and flow keep what the queue accounted.
	state        uint8
	size         int64
	enq          time.Time     // by the Queue's Clock, at Push
	done         chan struct{} // made by the first Wait, closed when the item leaves
	err          error         // why it left: nil when dispatched
	flow         *flowQueue
	fprev, fnext *Item // the flow's items, oldest first
	bprev, bnext *Item // the band's items in Push order, oldest first
}

// Item states.
const (
	itemIdle   uint8 = iota // never pushed
	itemQueued              // waiting in a Queue
	itemDone                // left the queue; err says how
)

var (
	// ErrQueueFull is returned by Push when the queue's bounds are
	// reached and nothing less urgent, nor of a flow past its share, can
	// be shed to make room.
	ErrQueueFull = errors.New("flow: queue full")
	// ErrShed is returned by Wait for an item removed from the queue to
	// make room for a more urgent one, or for one of a flow with fewer
	// items waiting.
	ErrShed = errors.New("flow: shed from the queue for a more urgent or fairer request")
	// ErrTimeout is returned by Wait for an item that waited
	// QueueLimits.MaxWait without being dispatched.
	ErrTimeout = errors.New("flow: timed out in the queue")

	errQueued    = errors.New("flow: item is already queued")
	errNotQueued = errors.New("flow: item was never queued")
)

// flowQueue is one flow's waiting items in one band, and its place in
// the band's round-robin.
type flowQueue struct {
	key        string
	band       *band
	head, tail *Item
	n          int
	prev, next *flowQueue // the band's round-robin order: next served first
}

// band is the waiting items of one priority.
type band struct {
	prio         int
	flows        map[string]*flowQueue
	fhead, ftail *flowQueue // round-robin order: fhead is served next
	ihead, itail *Item      // every item of the band in Push order
	n            int
	bytes        int64
}

// Free lists keep a steady churn of flows and bands from allocating;
// they are bounded so that a past burst of flows is not held forever.
const (
	maxFreeFlows = 64
	maxFreeBands = 8
)

// Queue is the gateway queue: requests wait in it while every replica
// that could serve them is saturated. Dispatch order is strict between
// priority bands (lower Priority first) and round-robin between the
// flows of a band (a flow just served goes to the back), each flow first
// in, first out; the round-robin position persists across Dispatch
// calls. A flow with nothing waiting is forgotten, so memory is bounded
// by the items waiting. It is safe for concurrent use.
type Queue struct {
	clock Clock

	mu        sync.Mutex
	limits    QueueLimits
	bands     []*band // ascending Priority; only bands with items
	n         int
	bytes     int64
	freeFlows []*flowQueue
	freeBands []*band
}

// NewQueue returns an empty Queue bounded by l, telling enqueue times by
// c (nil means SystemClock).
func NewQueue(l QueueLimits, c Clock) *Queue {
	if c == nil {
		c = SystemClock{}
	}
	return &Queue{clock: c, limits: l}
}

// SetLimits replaces the bounds (a configuration reload). Queued items
// stay: if the new bounds are lower than what waits, nothing is evicted
// and Pushes are refused (or shed less urgent items) until it is below.
// A new MaxWait applies to Waits that start after the call.
func (q *Queue) SetLimits(l QueueLimits) {
	q.mu.Lock()
	q.limits = l
	q.mu.Unlock()
}

// Push enqueues it at the back of its flow in its band. When a bound
// would be passed, Push sheds (see room) the most recently queued items
// of bands less urgent than it, then those of the largest flows of its
// own band while they hold more than its flow will, until it fits (each
// shed item's Wait returns ErrShed); if it cannot fit even so, Push
// returns ErrQueueFull, enqueues nothing and sheds nothing.
// Pushing an item that is already queued is an error.
func (q *Queue) Push(it *Item) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state == itemQueued {
		return errQueued
	}
	size := max(it.Bytes, 0)
	shed, ok := q.room(it.Priority, it.Flow, size)
	if !ok {
		return ErrQueueFull
	}
	for _, x := range shed {
		q.remove(x, ErrShed)
	}

	b := q.band(it.Priority)
	f := b.flows[it.Flow]
	if f == nil {
		f = q.newFlow(it.Flow, b)
		b.flows[it.Flow] = f
		b.appendFlow(f)
	}
	it.state, it.err, it.done = itemQueued, nil, nil
	it.size = size
	it.enq = q.clock.Now()
	it.flow = f
	pushBack(&f.head, &f.tail, it, flowLinks)
	pushBack(&b.ihead, &b.itail, it, bandLinks)
	f.n++
	b.n++
	b.bytes += size
	q.n++
	q.bytes += size
	return nil
}

// room reports whether an item of priority prio, flow and size bytes
// fits, and which items Push must shed first, in order: the newest of the
// least urgent band, then the next newest, and so on, only from bands
// less urgent than prio; then, in prio's own band, the newest of its
// largest flow (the first in round-robin order among equals) while that
// flow holds more items than the newcomer's flow will: a flow past its
// share gives way to one within it, so one tenant's burst that fills the
// queue is shed rather than another tenant's next request refused. It
// changes nothing.
func (q *Queue) room(prio int, flow string, size int64) (shed []*Item, ok bool) {
	l := q.limits
	n, bytes := q.n+1, q.bytes+size
	fits := func() bool {
		return n <= l.MaxQueued && (l.MaxQueuedBytes <= 0 || bytes <= l.MaxQueuedBytes)
	}
	if fits() {
		return nil, true
	}
	take := func(it *Item) {
		shed = append(shed, it)
		n--
		bytes -= it.size
	}
	for i := len(q.bands) - 1; i >= 0 && q.bands[i].prio > prio; i-- {
		for it := q.bands[i].itail; it != nil; it = it.bprev {
			if take(it); fits() {
				return shed, true
			}
		}
	}
	i, found := q.findBand(prio)
	if !found || l.MaxQueued <= 0 {
		return nil, false
	}
	b := q.bands[i]
	own := 1 // the newcomer
	if f := b.flows[flow]; f != nil {
		own += f.n
	}
	var cut map[*flowQueue]int      // items planned off each flow
	var newest map[*flowQueue]*Item // each flow's oldest item planned off
	for !fits() {
		var hog *flowQueue
		most := own
		for f := b.fhead; f != nil; f = f.next {
			if c := f.n - cut[f]; f.key != flow && c > most {
				hog, most = f, c
			}
		}
		if hog == nil {
			return nil, false
		}
		if cut == nil {
			cut, newest = map[*flowQueue]int{}, map[*flowQueue]*Item{}
		}
		it := hog.tail
		if prev := newest[hog]; prev != nil {
			it = prev.fprev
		}
		newest[hog] = it
		cut[hog]++
		take(it)
	}
	return shed, true
}

// Wait blocks until it is dispatched (nil), ctx is done (it leaves the
// queue and Wait returns ctx.Err()), QueueLimits.MaxWait has passed since
// Push by the queue's Clock (it leaves, ErrTimeout), or it is shed
// (ErrShed). An item dispatched at the same time as ctx ends counts as
// dispatched: Wait returns nil, so the caller never loses a dispatched
// slot. Wait on an item that already left returns how it left at once.
func (q *Queue) Wait(ctx context.Context, it *Item) error {
	q.mu.Lock()
	switch it.state {
	case itemIdle:
		q.mu.Unlock()
		return errNotQueued
	case itemDone:
		err := it.err
		q.mu.Unlock()
		return err
	}
	if err := ctx.Err(); err != nil {
		q.remove(it, err)
		q.mu.Unlock()
		return err
	}
	var expired <-chan time.Time
	if mw := q.limits.MaxWait; mw > 0 {
		left := mw - q.clock.Now().Sub(it.enq)
		if left <= 0 {
			q.remove(it, ErrTimeout)
			q.mu.Unlock()
			return ErrTimeout
		}
		t := time.NewTimer(left)
		defer t.Stop()
		expired = t.C
	}
	if it.done == nil {
		it.done = make(chan struct{})
	}
	done := it.done
	q.mu.Unlock()

	select {
	case <-done:
		// Closed after err was set, under the lock.
		return it.err
	case <-ctx.Done():
		return q.leave(it, ctx.Err())
	case <-expired:
		return q.leave(it, ErrTimeout)
	}
}

// leave removes it with err if it is still queued, and returns how it
// left: a Dispatch that came first wins.
func (q *Queue) leave(it *Item, err error) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if it.state == itemQueued {
		q.remove(it, err)
	}
	return it.err
}

// Dispatch hands out waiting items in order, strict between bands and
// round-robin between the flows of a band, for as long as ready accepts
// them: ready is asked about the next item in order, and true means the
// item is dispatched (its Wait returns nil). When ready returns false
// for an item, Dispatch skips that item's flow for the rest of the call
// and goes on with the band's next flow, then the next band, so that
// requests another replica has room for are not stuck behind it; a
// skipped flow keeps its round-robin place. It returns how many items it
// dispatched.
//
// ready is called with the queue's lock held: it must be quick and must
// not call any method of the Queue (that deadlocks). If ready panics,
// the queue stays consistent and the item it was asked about stays
// queued.
func (q *Queue) Dispatch(ready func(*Item) bool) int { return q.DispatchAhead(1, ready) }

// DispatchAhead is Dispatch that, within a flow, asks ready about up to
// ahead items from its oldest on and dispatches the first it accepts,
// the others keeping their places: a request may let a younger one of
// its flow go first (to wait for the replica that holds its prefix)
// without holding up the whole flow. The flow is skipped when ready
// accepts none of them.
func (q *Queue) DispatchAhead(ahead int, ready func(*Item) bool) int {
	ahead = max(ahead, 1)
	q.mu.Lock()
	defer q.mu.Unlock()
	dispatched := 0
	for i := 0; i < len(q.bands); {
		b := q.bands[i]
		// Every flow before f in the band's order has been skipped in
		// this call: a served flow moves behind f, a skipped one stays.
		f := b.fhead
		for f != nil {
			var chosen *Item
			for it, k := f.head, 0; it != nil && k < ahead; it, k = it.fnext, k+1 {
				if ready(it) {
					chosen = it
					break
				}
			}
			if chosen == nil {
				f = f.next
				continue
			}
			next := f.next
			q.remove(chosen, nil)
			dispatched++
			if b.n == 0 {
				break // the band is gone; q.bands[i] is the next one
			}
			if f.n > 0 {
				b.unlinkFlow(f)
				b.appendFlow(f)
				if next == nil {
					next = f // the only flow not skipped: serve it again
				}
			}
			f = next
		}
		if b.n > 0 {
			i++
		}
	}
	return dispatched
}

// Len returns the number of items waiting and the sum of their Bytes.
func (q *Queue) Len() (n int, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n, q.bytes
}

// Ahead reports whether anything waits that Dispatch would hand out
// before an item of priority prio and flow pushed now: an item of a more
// urgent band, or one of the same flow in the same band. When nothing is
// ahead, the item would be the first of its flow in a band Dispatch
// reaches first, behind other flows' turns only: a caller that may let
// such a request pass those turns (one of a tenant under its fair share)
// can serve it at once rather than queue it.
func (q *Queue) Ahead(prio int, flow string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, b := range q.bands {
		if b.prio < prio {
			return true
		}
		if b.prio == prio {
			return b.flows[flow] != nil
		}
	}
	return false
}

// maxStatsFlows bounds QueueStats.Flows.
const maxStatsFlows = 10

// QueueStats is a snapshot of a Queue, for metrics and /debug.
type QueueStats struct {
	// Queued is the number of items waiting; Bytes the sum of their
	// Item.Bytes.
	Queued int   `json:"queued"`
	Bytes  int64 `json:"bytes"`
	// Bands is every band with items waiting, most urgent first.
	Bands []BandStats `json:"bands"`
	// Flows is the flows with the most items waiting, summed over the
	// bands, most first (ties by name), at most 10.
	Flows []Backlog `json:"flows"`
	// FlowCount is the number of distinct flows waiting, of which Flows
	// lists the top.
	FlowCount int `json:"flow_count"`
}

// BandStats is one priority band in QueueStats.
type BandStats struct {
	// Priority is the band's Item.Priority.
	Priority int `json:"priority"`
	// Queued is the number of items waiting in the band; Bytes the sum
	// of their Item.Bytes; Flows the number of flows they belong to.
	Queued int   `json:"queued"`
	Bytes  int64 `json:"bytes"`
	Flows  int   `json:"flows"`
	// OldestWait is how long the band's oldest item has waited, by the
	// queue's Clock.
	OldestWait time.Duration `json:"oldest_wait_ns"`
}

// Backlog is one flow's requests waiting, in QueueStats.
type Backlog struct {
	// Flow is the Item.Flow key.
	Flow string `json:"flow"`
	// Queued is the number of the flow's items waiting, in every band.
	Queued int `json:"queued"`
}

// Stats returns a snapshot: per band, the number waiting and the oldest
// wait; per flow, the number waiting, for the 10 flows with the most.
func (q *Queue) Stats() QueueStats {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	s := QueueStats{Queued: q.n, Bytes: q.bytes, Bands: make([]BandStats, 0, len(q.bands))}
	counts := make(map[string]int)
	for _, b := range q.bands {
		s.Bands = append(s.Bands, BandStats{
			Priority:   b.prio,
			Queued:     b.n,
			Bytes:      b.bytes,
			Flows:      len(b.flows),
			OldestWait: max(now.Sub(b.ihead.enq), 0),
		})
		for k, f := range b.flows {
			counts[k] += f.n
		}
	}
	s.FlowCount = len(counts)
	flows := make([]Backlog, 0, len(counts))
	for k, n := range counts {
		flows = append(flows, Backlog{Flow: k, Queued: n})
	}
	slices.SortFunc(flows, func(a, b Backlog) int {
		if c := cmp.Compare(b.Queued, a.Queued); c != 0 {
			return c
		}
		return cmp.Compare(a.Flow, b.Flow)
	})
	if len(flows) > maxStatsFlows {
		flows = slices.Clip(flows[:maxStatsFlows])
	}
	s.Flows = flows
	return s
}

// remove takes the queued item it out of the queue for err (nil when
// dispatched), wakes its Wait, and forgets its flow and band if they are
// left empty. The lock is held.
func (q *Queue) remove(it *Item, err error) {
	f := it.flow
	b := f.band
	unlink(&f.head, &f.tail, it, flowLinks)
	unlink(&b.ihead, &b.itail, it, bandLinks)
	it.flow = nil
	f.n--
	b.n--
	b.bytes -= it.size
	q.n--
	q.bytes -= it.size

	it.state, it.err = itemDone, err
	if it.done != nil {
		close(it.done)
	}

	if f.n == 0 {
		b.unlinkFlow(f)
		delete(b.flows, f.key)
		if len(q.freeFlows) < maxFreeFlows {
			*f = flowQueue{}
			q.freeFlows = append(q.freeFlows, f)
		}
	}
	if b.n == 0 {
		if i, ok := q.findBand(b.prio); ok {
			q.bands = slices.Delete(q.bands, i, i+1)
		}
		if len(q.freeBands) < maxFreeBands {
			clear(b.flows)
			*b = band{flows: b.flows}
			q.freeBands = append(q.freeBands, b)
		}
	}
}

// findBand returns the index of band prio in q.bands, or where it would
// go.
func (q *Queue) findBand(prio int) (int, bool) {
	return slices.BinarySearchFunc(q.bands, prio, func(b *band, p int) int {
		return cmp.Compare(b.prio, p)
	})
}

// band returns band prio, making it if it has no items.
func (q *Queue) band(prio int) *band {
	i, ok := q.findBand(prio)
	if ok {
		return q.bands[i]
	}
	var b *band
	if n := len(q.freeBands); n > 0 {
		b = q.freeBands[n-1]
		q.freeBands = q.freeBands[:n-1]
	} else {
		b = &band{flows: make(map[string]*flowQueue)}
	}
	b.prio = prio
	q.bands = slices.Insert(q.bands, i, b)
	return b
}

// newFlow returns an empty flowQueue for key in b.
func (q *Queue) newFlow(key string, b *band) *flowQueue {
	var f *flowQueue
	if n := len(q.freeFlows); n > 0 {
		f = q.freeFlows[n-1]
		q.freeFlows = q.freeFlows[:n-1]
	} else {
		f = new(flowQueue)
	}
	f.key, f.band = key, b
	return f
}

// appendFlow puts f at the back of b's round-robin.
func (b *band) appendFlow(f *flowQueue) { pushBack(&b.fhead, &b.ftail, f, rrLinks) }

// unlinkFlow takes f out of b's round-robin.
func (b *band) unlinkFlow(f *flowQueue) { unlink(&b.fhead, &b.ftail, f, rrLinks) }

// The queue's three intrusive lists (a flow's items, a band's items, a
// band's flows) link their nodes through fields of the nodes; links
// gives a node's previous and next fields in one of them.
func flowLinks(it *Item) (prev, next **Item)        { return &it.fprev, &it.fnext }
func bandLinks(it *Item) (prev, next **Item)        { return &it.bprev, &it.bnext }
func rrLinks(f *flowQueue) (prev, next **flowQueue) { return &f.prev, &f.next }

// pushBack links x at the back of the list from *head to *tail.
func pushBack[T any](head, tail **T, x *T, links func(*T) (prev, next **T)) {
	prev, next := links(x)
	*prev, *next = *tail, nil
	if *tail != nil {
		_, tnext := links(*tail)
		*tnext = x
	} else {
		*head = x
	}
	*tail = x
}

// unlink takes x out of the list from *head to *tail.
func unlink[T any](head, tail **T, x *T, links func(*T) (prev, next **T)) {
	prev, next := links(x)
	if *prev != nil {
		_, pnext := links(*prev)
		*pnext = *next
	} else {
		*head = *next
	}
	if *next != nil {
		nprev, _ := links(*next)
		*nprev = *prev
	} else {
		*tail = *prev
	}
	*prev, *next = nil, nil
}
