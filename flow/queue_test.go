package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// qGuard bounds every blocking step of these tests.
const qGuard = 5 * time.Second

// qVal is the Item.Value of these tests.
type qVal struct {
	id    int
	model int
}

func qID(it *Item) int { return it.Value.(qVal).id }

// all accepts every item.
func qAll(*Item) bool { return true }

// upTo accepts the first n items it is asked about.
func qUpTo(n int) func(*Item) bool {
	return func(*Item) bool {
		if n <= 0 {
			return false
		}
		n--
		return true
	}
}

// drain dispatches everything and returns the ids in dispatch order.
func qDrain(q *Queue) []int {
	var ids []int
	q.Dispatch(func(it *Item) bool {
		ids = append(ids, qID(it))
		return true
	})
	return ids
}

func qPush(t testing.TB, q *Queue, it *Item) {
	t.Helper()
	if err := q.Push(it); err != nil {
		t.Fatalf("Push(%+v) = %v", it.Value, err)
	}
}

func qItem(id, prio int, flow string, bytes int64) *Item {
	return &Item{Priority: prio, Flow: flow, Bytes: bytes, Value: qVal{id: id}}
}

// waitResult runs Wait in a goroutine and returns where its result lands.
func qWaitAsync(ctx context.Context, q *Queue, it *Item) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- q.Wait(ctx, it) }()
	return ch
}

func qRecv(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(qGuard):
		t.Fatal("Wait did not return")
		return nil
	}
}

// --- the reference model ---

// refItem is an item of refQueue.
type refItem struct {
	id, prio, model int
	flow            string
	size            int64
}

// refQueue is the naive reference of Queue's semantics: slices and
// linear scans.
type refQueue struct {
	lim   QueueLimits
	items []*refItem       // waiting, in Push order
	order map[int][]string // per band, its flows with items, next served first
	ended map[int]string   // id -> "dispatched", "shed", "cancelled"
	byID  map[int]*refItem // waiting, by id
}

func newRefQueue(l QueueLimits) *refQueue {
	return &refQueue{lim: l, order: map[int][]string{}, ended: map[int]string{}, byID: map[int]*refItem{}}
}

func (r *refQueue) size() (int, int64) {
	var b int64
	for _, it := range r.items {
		b += it.size
	}
	return len(r.items), b
}

func (r *refQueue) fits(n int, b int64) bool {
	return n <= r.lim.MaxQueued && (r.lim.MaxQueuedBytes <= 0 || b <= r.lim.MaxQueuedBytes)
}

// push returns whether x was queued and the ids shed for it, in order.
func (r *refQueue) push(x *refItem) (bool, []int) {
	x.size = max(x.size, 0)
	n, b := r.size()
	n, b = n+1, b+x.size
	var shed []int
	if !r.fits(n, b) {
		// Candidates: less urgent than x, least urgent band first,
		// newest first within a band.
		var cand []*refItem
		for i := len(r.items) - 1; i >= 0; i-- {
			if r.items[i].prio > x.prio {
				cand = append(cand, r.items[i])
			}
		}
		sort.SliceStable(cand, func(i, j int) bool { return cand[i].prio > cand[j].prio })
		ok := false
		for _, c := range cand {
			shed = append(shed, c.id)
			n, b = n-1, b-c.size
			if r.fits(n, b) {
				ok = true
				break
			}
		}
		// Then, in x's band, the newest of the largest other flow (the
		// first in round-robin order among equals) while it holds more
		// than x's flow will.
		if !ok && r.lim.MaxQueued > 0 {
			gone := map[int]bool{}
			for _, id := range shed {
				gone[id] = true
			}
			inBand := func(flow string) []*refItem { // in push order
				var out []*refItem
				for _, it := range r.items {
					if it.prio == x.prio && it.flow == flow && !gone[it.id] {
						out = append(out, it)
					}
				}
				return out
			}
			own := len(inBand(x.flow)) + 1
			for !r.fits(n, b) {
				most := own
				var hog []*refItem
				for _, f := range r.order[x.prio] {
					if items := inBand(f); f != x.flow && len(items) > most {
						hog, most = items, len(items)
					}
				}
				if hog == nil {
					break
				}
				last := hog[len(hog)-1]
				shed = append(shed, last.id)
				gone[last.id] = true
				n, b = n-1, b-last.size
			}
			ok = r.fits(n, b)
		}
		if !ok {
			return false, nil
		}
		for _, id := range shed {
			r.remove(id, "shed")
		}
	}
	r.items = append(r.items, x)
	r.byID[x.id] = x
	if !slices.Contains(r.order[x.prio], x.flow) {
		r.order[x.prio] = append(r.order[x.prio], x.flow)
	}
	return true, shed
}

func (r *refQueue) remove(id int, how string) {
	x := r.byID[id]
	delete(r.byID, id)
	r.ended[id] = how
	r.items = slices.DeleteFunc(r.items, func(y *refItem) bool { return y == x })
	if r.front(x.prio, x.flow) == nil {
		r.order[x.prio] = slices.DeleteFunc(r.order[x.prio], func(f string) bool { return f == x.flow })
		if len(r.order[x.prio]) == 0 {
			delete(r.order, x.prio)
		}
	}
}

// front returns the oldest item of flow in band prio, or nil.
func (r *refQueue) front(prio int, flow string) *refItem {
	for _, y := range r.items {
		if y.prio == prio && y.flow == flow {
			return y
		}
	}
	return nil
}

func (r *refQueue) dispatch(ready func(*refItem) bool) []int {
	prios := make([]int, 0, len(r.order))
	for p := range r.order {
		prios = append(prios, p)
	}
	slices.Sort(prios)
	var out []int
	for _, p := range prios {
		skipped := map[string]bool{}
		for {
			flow := ""
			found := false
			for _, f := range r.order[p] {
				if !skipped[f] {
					flow, found = f, true
					break
				}
			}
			if !found {
				break
			}
			x := r.front(p, flow)
			if !ready(x) {
				skipped[flow] = true
				continue
			}
			r.remove(x.id, "dispatched")
			out = append(out, x.id)
			if o := r.order[p]; slices.Contains(o, flow) {
				o = slices.DeleteFunc(o, func(f string) bool { return f == flow })
				r.order[p] = append(o, flow)
			}
		}
	}
	return out
}

// readyPred is a ready predicate made the same for Queue and refQueue:
// a budget of dispatches and a set of models with room. It logs every
// question it is asked.
type readyPred struct {
	budget int
	models [3]bool
	log    []string
}

func (p *readyPred) ask(id, model int) bool {
	ok := p.budget > 0 && p.models[model]
	if ok {
		p.budget--
	}
	p.log = append(p.log, fmt.Sprintf("%d:%t", id, ok))
	return ok
}

func qRandLimits(rng *rand.Rand) QueueLimits {
	l := QueueLimits{MaxQueued: rng.IntN(40)}
	if rng.IntN(2) == 0 {
		l.MaxQueuedBytes = 200 + rng.Int64N(2000)
	}
	return l
}

func TestQueueMatchesReference(t *testing.T) {
	prios := []int{-1, 0, 1, 2, 3}
	flows := []string{"a", "b", "c", "d", "e", "f"}
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
			lim := QueueLimits{MaxQueued: 30, MaxQueuedBytes: 1500}
			q := NewQueue(lim, newFakeClock())
			ref := newRefQueue(lim)
			live := map[int]*Item{} // queued in q, by id
			nextID := 0
			var counts [5]int

			// check compares what left q in this step with what left
			// ref, and the sizes.
			check := func(step int, op string) {
				t.Helper()
				for id, it := range live {
					if it.state == itemQueued {
						continue
					}
					delete(live, id)
					want, ok := ref.ended[id]
					if !ok {
						t.Fatalf("step %d (%s): item %d left q (%v) but waits in ref", step, op, id, it.err)
					}
					var got string
					switch err := q.Wait(context.Background(), it); {
					case err == nil:
						got = "dispatched"
					case errors.Is(err, ErrShed):
						got = "shed"
					case errors.Is(err, context.Canceled):
						got = "cancelled"
					default:
						got = err.Error()
					}
					if got != want {
						t.Fatalf("step %d (%s): item %d %s, ref %s", step, op, id, got, want)
					}
				}
				for id := range ref.byID {
					if live[id] == nil {
						t.Fatalf("step %d (%s): item %d waits in ref, not in q", step, op, id)
					}
				}
				n, b := q.Len()
				rn, rb := ref.size()
				if n != rn || b != rb {
					t.Fatalf("step %d (%s): Len = %d, %d; ref %d, %d", step, op, n, b, rn, rb)
				}
			}

			for step := range 5000 {
				switch r := rng.IntN(100); {
				case r < 50: // push
					counts[0]++
					id := nextID
					nextID++
					x := &refItem{id: id, prio: prios[rng.IntN(len(prios))], flow: flows[rng.IntN(len(flows))],
						model: rng.IntN(3), size: rng.Int64N(120) - 10}
					it := &Item{Priority: x.prio, Flow: x.flow, Bytes: x.size, Value: qVal{id: id, model: x.model}}
					err := q.Push(it)
					ok, shed := ref.push(x)
					if ok != (err == nil) || (err != nil && !errors.Is(err, ErrQueueFull)) {
						t.Fatalf("step %d: Push(%d) = %v, ref accepted %t", step, id, err, ok)
					}
					if ok {
						live[id] = it
					}
					var qshed []int
					for id, it := range live {
						if it.state == itemDone && errors.Is(it.err, ErrShed) {
							qshed = append(qshed, id)
						}
					}
					slices.Sort(qshed)
					slices.Sort(shed)
					if !slices.Equal(qshed, shed) {
						t.Fatalf("step %d: Push(%d) shed %v, ref %v", step, id, qshed, shed)
					}
					check(step, "push")
				case r < 65: // cancel
					counts[1]++
					if len(ref.items) == 0 {
						continue
					}
					x := ref.items[rng.IntN(len(ref.items))]
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					if err := q.Wait(ctx, live[x.id]); !errors.Is(err, context.Canceled) {
						t.Fatalf("step %d: Wait(cancelled ctx) = %v", step, err)
					}
					ref.remove(x.id, "cancelled")
					check(step, "cancel")
				case r < 93: // dispatch
					counts[2]++
					var p readyPred
					p.budget = rng.IntN(8)
					for m := range p.models {
						p.models[m] = rng.IntN(3) > 0
					}
					pr := p
					pr.log = nil
					n := q.Dispatch(func(it *Item) bool {
						v := it.Value.(qVal)
						return p.ask(v.id, v.model)
					})
					out := ref.dispatch(func(x *refItem) bool { return pr.ask(x.id, x.model) })
					if !slices.Equal(p.log, pr.log) {
						t.Fatalf("step %d: Dispatch asked %v, ref %v", step, p.log, pr.log)
					}
					if n != len(out) {
						t.Fatalf("step %d: Dispatch = %d, ref %d", step, n, len(out))
					}
					check(step, "dispatch")
				case r < 97: // reload
					counts[3]++
					l := qRandLimits(rng)
					q.SetLimits(l)
					ref.lim = l
				default: // stats
					counts[4]++
					s := q.Stats()
					bands := make([]int, 0, len(s.Bands))
					total := 0
					for _, b := range s.Bands {
						bands = append(bands, b.Priority)
						total += b.Queued
						rn := 0
						for _, x := range ref.items {
							if x.prio == b.Priority {
								rn++
							}
						}
						if b.Queued != rn || b.Flows != len(ref.order[b.Priority]) {
							t.Fatalf("step %d: band %+v, ref %d items %d flows", step, b, rn, len(ref.order[b.Priority]))
						}
					}
					if total != len(ref.items) || s.Queued != total || len(bands) != len(ref.order) || !slices.IsSorted(bands) {
						t.Fatalf("step %d: Stats %+v, ref %d items in %d bands", step, s, len(ref.items), len(ref.order))
					}
				}
			}
			if counts[0] == 0 || counts[1] == 0 || counts[2] == 0 {
				t.Fatalf("ops %v: not every kind ran", counts)
			}
			t.Logf("pushes %d, cancels %d, dispatches %d, reloads %d, stats %d; shed %d, dispatched %d",
				counts[0], counts[1], counts[2], counts[3], counts[4],
				qCountEnded(ref, "shed"), qCountEnded(ref, "dispatched"))
		})
	}
}

func qCountEnded(r *refQueue, how string) int {
	n := 0
	for _, h := range r.ended {
		if h == how {
			n++
		}
	}
	return n
}

// --- order ---

func TestQueueFairness(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 2000}, nil)
	for i := range 1000 {
		qPush(t, q, qItem(i, 0, "A", 1))
	}
	qPush(t, q, qItem(1000, 0, "B", 1))
	got := make([]int, 0, 2)
	for range 2 {
		got = append(got, qDrainN(q, 1)...)
	}
	if !slices.Contains(got, 1000) {
		t.Fatalf("first two dispatches %v, want B's item 1000 among them", got)
	}
	// After B, A alone: FIFO.
	if rest := qDrain(q); len(rest) != 999 || rest[0] != 1 || !slices.IsSorted(rest) {
		t.Fatalf("rest of A: %d items starting %v, want 999 in order", len(rest), rest[:min(3, len(rest))])
	}
}

// drainN dispatches up to n items and returns their ids.
func qDrainN(q *Queue, n int) []int {
	var ids []int
	q.Dispatch(func(it *Item) bool {
		if len(ids) == n {
			return false
		}
		ids = append(ids, qID(it))
		return true
	})
	return ids
}

func TestQueueOrder(t *testing.T) {
	type push struct {
		prio int
		flow string
	}
	tests := []struct {
		name   string
		pushes []push // id is the index
		steps  []int  // items per Dispatch
		want   []int
	}{
		{
			name:   "round-robin",
			pushes: []push{{0, "a"}, {0, "a"}, {0, "a"}, {0, "b"}, {0, "c"}, {0, "c"}},
			steps:  []int{6},
			want:   []int{0, 3, 4, 1, 5, 2},
		},
		{
			name:   "position persists across calls",
			pushes: []push{{0, "a"}, {0, "a"}, {0, "b"}, {0, "b"}, {0, "c"}},
			steps:  []int{1, 1, 1, 1, 1},
			want:   []int{0, 2, 4, 1, 3},
		},
		{
			name:   "strict bands, negative first",
			pushes: []push{{2, "a"}, {1, "a"}, {0, "b"}, {-3, "c"}, {1, "b"}},
			steps:  []int{5},
			want:   []int{3, 2, 1, 4, 0},
		},
		{
			name:   "flow per band",
			pushes: []push{{1, "a"}, {0, "a"}, {1, "b"}, {0, "a"}},
			steps:  []int{2, 2},
			want:   []int{1, 3, 0, 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue(QueueLimits{MaxQueued: 100}, nil)
			for i, p := range tc.pushes {
				qPush(t, q, qItem(i, p.prio, p.flow, 0))
			}
			var got []int
			for _, n := range tc.steps {
				got = append(got, qDrainN(q, n)...)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("dispatched %v, want %v", got, tc.want)
			}
			if n, _ := q.Len(); n != 0 {
				t.Fatalf("Len = %d after all dispatched", n)
			}
		})
	}
}

func TestQueueStrictBands(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 200}, nil)
	for i := range 100 {
		qPush(t, q, qItem(i, 1, fmt.Sprint("f", i%7), 1))
	}
	qPush(t, q, qItem(100, 0, "late", 1))
	if got := qDrainN(q, 1); !slices.Equal(got, []int{100}) {
		t.Fatalf("first dispatch %v, want the band-0 item 100", got)
	}
}

func TestQueueReadySkipsFlow(t *testing.T) {
	// Models: 0 has no room, 1 has.
	q := NewQueue(QueueLimits{MaxQueued: 100}, nil)
	push := func(id, prio int, flow string, model int) {
		qPush(t, q, &Item{Priority: prio, Flow: flow, Value: qVal{id: id, model: model}})
	}
	push(0, 0, "a", 0) // a's head is stuck: a is skipped,
	push(1, 0, "a", 1) // so a's second item waits behind it (FIFO per flow).
	push(2, 0, "b", 1)
	push(3, 0, "b", 1)
	push(4, 1, "c", 1) // the next band is served too
	push(5, 1, "d", 0)
	var asked, got []int
	n := q.Dispatch(func(it *Item) bool {
		v := it.Value.(qVal)
		asked = append(asked, v.id)
		if v.model == 1 {
			got = append(got, v.id)
			return true
		}
		return false
	})
	if want := []int{2, 3, 4}; n != 3 || !slices.Equal(got, want) {
		t.Fatalf("Dispatch = %d %v, want %v", n, got, want)
	}
	if want := []int{0, 2, 3, 4, 5}; !slices.Equal(asked, want) {
		t.Fatalf("asked about %v, want %v (each skipped flow once)", asked, want)
	}
	// The skipped flow kept its place: it is first once its model has room.
	if got := qDrainN(q, 1); !slices.Equal(got, []int{0}) {
		t.Fatalf("next dispatch %v, want 0", got)
	}
}

// DispatchAhead looks past a flow's head for an item ready to go: the
// head and the other items keep their places, and a flow none of whose
// first items is ready is skipped.
func TestQueueDispatchAhead(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 100}, nil)
	push := func(id int, flow string, model int) {
		qPush(t, q, &Item{Flow: flow, Value: qVal{id: id, model: model}})
	}
	push(0, "a", 0)
	push(1, "a", 0)
	push(2, "a", 1) // within two of a's head: not reached with ahead 2
	push(3, "b", 0)
	push(4, "b", 1)
	ready := func(it *Item) bool { return it.Value.(qVal).model == 1 }
	var got []int
	collect := func(it *Item) bool {
		if ready(it) {
			got = append(got, it.Value.(qVal).id)
			return true
		}
		return false
	}
	if n := q.DispatchAhead(2, collect); n != 1 || !slices.Equal(got, []int{4}) {
		t.Fatalf("DispatchAhead(2) = %d %v, want b's second (4) only", n, got)
	}
	got = nil
	if n := q.DispatchAhead(3, collect); n != 1 || !slices.Equal(got, []int{2}) {
		t.Fatalf("DispatchAhead(3) = %d %v, want a's third (2)", n, got)
	}
	// The items passed over kept their order in their flows, and a,
	// served last, went behind b.
	if got := qDrainN(q, 3); !slices.Equal(got, []int{3, 0, 1}) {
		t.Fatalf("left %v, want 3 0 1", got)
	}
}

// --- leaving the queue ---

func TestQueueWaitCancel(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)
	it := qItem(1, 0, "a", 7)
	qPush(t, q, it)
	ctx, cancel := context.WithCancel(context.Background())
	ch := qWaitAsync(ctx, q, it)
	time.Sleep(10 * time.Millisecond) // let it block (not required for correctness)
	cancel()
	if err := qRecv(t, ch); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if n, b := q.Len(); n != 0 || b != 0 {
		t.Fatalf("Len = %d, %d after cancel", n, b)
	}
	if n := q.Dispatch(func(*Item) bool { t.Error("ready asked about a cancelled item"); return true }); n != 0 {
		t.Fatalf("Dispatch = %d after cancel", n)
	}
	if err := q.Wait(context.Background(), it); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait again = %v, want context.Canceled", err)
	}
}

func TestQueueWaitDeadline(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)
	it := qItem(1, 0, "a", 0)
	qPush(t, q, it)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := qRecv(t, qWaitAsync(ctx, q, it)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want context.DeadlineExceeded", err)
	}
}

func TestQueueMaxWait(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10, MaxWait: 50 * time.Millisecond}, nil)
	it := qItem(1, 0, "a", 3)
	qPush(t, q, it)
	if err := qRecv(t, qWaitAsync(context.Background(), q, it)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait = %v, want ErrTimeout", err)
	}
	if n, b := q.Len(); n != 0 || b != 0 {
		t.Fatalf("Len = %d, %d after timeout", n, b)
	}
}

func TestQueueMaxWaitCountsFromPush(t *testing.T) {
	// By the queue's Clock, the item has waited its MaxWait before Wait.
	c := newFakeClock()
	q := NewQueue(QueueLimits{MaxQueued: 10, MaxWait: time.Hour}, c)
	it := qItem(1, 0, "a", 0)
	qPush(t, q, it)
	c.Advance(time.Hour)
	if err := qRecv(t, qWaitAsync(context.Background(), q, it)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Wait = %v, want ErrTimeout", err)
	}
	if n, _ := q.Len(); n != 0 {
		t.Fatalf("Len = %d after timeout", n)
	}
}

func TestQueueWaitDispatched(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)

	// Dispatched while Wait blocks.
	it := qItem(1, 0, "a", 0)
	qPush(t, q, it)
	ch := qWaitAsync(context.Background(), q, it)
	if n := q.Dispatch(qAll); n != 1 {
		t.Fatalf("Dispatch = %d", n)
	}
	if err := qRecv(t, ch); err != nil {
		t.Fatalf("Wait = %v, want nil", err)
	}

	// Dispatched before Wait, whose context is already done: dispatch
	// wins.
	it = qItem(2, 0, "a", 0)
	qPush(t, q, it)
	q.Dispatch(qAll)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := q.Wait(ctx, it); err != nil {
		t.Fatalf("Wait(done ctx) after dispatch = %v, want nil", err)
	}

	// Pushed again once done.
	qPush(t, q, it)
	if err := q.Push(it); err == nil {
		t.Fatal("Push of a queued item succeeded")
	}
	if n, _ := q.Len(); n != 1 {
		t.Fatalf("Len = %d, want 1", n)
	}
	if err := q.Wait(context.Background(), &Item{}); err == nil {
		t.Fatal("Wait on an item never pushed succeeded")
	}
}

// --- bounds ---

// A full queue sheds, for a newcomer of its band, the newest item of the
// flow holding the most while it holds more than the newcomer's flow
// will: a burst that filled the queue gives way, item by item, until the
// two flows hold equal shares.
func TestQueueShedsTheLargestFlow(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 4}, nil)
	burst := make([]<-chan error, 0, 4)
	for i := range 4 {
		it := qItem(i, 0, "burst", 1)
		qPush(t, q, it)
		burst = append(burst, qWaitAsync(context.Background(), q, it))
	}
	qPush(t, q, qItem(10, 0, "victim", 1)) // burst 4 > 1: its newest goes
	if err := qRecv(t, burst[3]); !errors.Is(err, ErrShed) {
		t.Fatalf("the burst's newest = %v, want ErrShed", err)
	}
	qPush(t, q, qItem(11, 0, "victim", 1)) // burst 3 > 2: its next newest
	if err := qRecv(t, burst[2]); !errors.Is(err, ErrShed) {
		t.Fatalf("the burst's next newest = %v, want ErrShed", err)
	}
	if err := q.Push(qItem(12, 0, "victim", 1)); !errors.Is(err, ErrQueueFull) { // burst 2, victim would hold 3
		t.Fatalf("past an equal share = %v, want ErrQueueFull", err)
	}
	if got, want := qDrain(q), []int{0, 10, 1, 11}; !slices.Equal(got, want) {
		t.Fatalf("dispatched %v, want %v", got, want)
	}
}

func TestQueueShedding(t *testing.T) {
	tests := []struct {
		name string
		lim  QueueLimits
		size int64 // Bytes of every item
	}{
		{"count", QueueLimits{MaxQueued: 4}, 10},
		{"bytes", QueueLimits{MaxQueued: 100, MaxQueuedBytes: 40}, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := NewQueue(tc.lim, nil)
			waits := make([]<-chan error, 0, 4)
			for i := range 4 {
				it := qItem(i, 2, fmt.Sprint("f", i%2), tc.size)
				qPush(t, q, it)
				waits = append(waits, qWaitAsync(context.Background(), q, it))
			}
			// Less urgent, or equally urgent of a flow holding as much as
			// any: refused, nothing shed.
			for _, c := range []struct {
				prio int
				flow string
			}{{2, "f0"}, {3, "x"}} {
				if err := q.Push(qItem(10+c.prio, c.prio, c.flow, tc.size)); !errors.Is(err, ErrQueueFull) {
					t.Fatalf("Push band %d flow %s on a full queue = %v, want ErrQueueFull", c.prio, c.flow, err)
				}
			}
			if n, _ := q.Len(); n != 4 {
				t.Fatalf("Len = %d after refusals", n)
			}
			// More urgent: the newest band-2 item is shed.
			qPush(t, q, qItem(20, 0, "x", tc.size))
			if err := qRecv(t, waits[3]); !errors.Is(err, ErrShed) {
				t.Fatalf("newest band-2 Wait = %v, want ErrShed", err)
			}
			if n, b := q.Len(); n != 4 || b != 4*tc.size {
				t.Fatalf("Len = %d, %d after shedding", n, b)
			}
			if got, want := qDrain(q), []int{20, 0, 1, 2}; !slices.Equal(got, want) {
				t.Fatalf("dispatched %v, want %v", got, want)
			}
			for i := range 3 {
				if err := qRecv(t, waits[i]); err != nil {
					t.Fatalf("Wait %d = %v, want nil", i, err)
				}
			}
		})
	}
}

func TestQueueShedLeastUrgentFirst(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 100, MaxQueuedBytes: 100}, nil)
	its := []*Item{
		qItem(0, 3, "a", 20), // oldest of the least urgent band
		qItem(1, 1, "a", 30),
		qItem(2, 3, "b", 20), // newest of the least urgent band
		qItem(3, 2, "a", 30),
		qItem(4, 3, "c", 0), // newest of band 3: shed first, though it frees no bytes
	}
	for _, it := range its {
		qPush(t, q, it)
	}
	// 100 bytes queued. A band-1 item of 50 bytes needs 50 freed: band 3
	// newest first (0+20+20), then band 2 (30); band 1 is as urgent,
	// never shed.
	qPush(t, q, qItem(5, 1, "c", 50))
	for i, want := range []error{ErrShed, nil, ErrShed, ErrShed, ErrShed} {
		if want == nil {
			continue
		}
		if err := q.Wait(context.Background(), its[i]); !errors.Is(err, want) {
			t.Fatalf("Wait %d = %v, want %v", i, err, want)
		}
	}
	if got, want := qDrain(q), []int{1, 5}; !slices.Equal(got, want) {
		t.Fatalf("left after shedding %v, want %v", got, want)
	}

	// Compute first, then shed: a push that cannot fit even after
	// shedding every less urgent item sheds nothing.
	qPush(t, q, qItem(6, 3, "a", 60))
	qPush(t, q, qItem(7, 0, "a", 30))
	if err := q.Push(qItem(8, 1, "a", 75)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Push = %v, want ErrQueueFull", err)
	}
	if err := q.Push(qItem(9, -1, "a", 101)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Push larger than the byte bound = %v, want ErrQueueFull", err)
	}
	if n, b := q.Len(); n != 2 || b != 90 {
		t.Fatalf("Len = %d, %d, want 2, 90: nothing shed", n, b)
	}
}

func TestQueueNoQueue(t *testing.T) {
	q := NewQueue(QueueLimits{}, nil)
	if err := q.Push(qItem(0, -5, "a", 0)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Push with MaxQueued 0 = %v, want ErrQueueFull", err)
	}
}

func TestQueueSetLimits(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)
	for i := range 10 {
		qPush(t, q, qItem(i, 1, "a", 5))
	}
	q.SetLimits(QueueLimits{MaxQueued: 5, MaxQueuedBytes: 100})
	if n, b := q.Len(); n != 10 || b != 50 {
		t.Fatalf("Len = %d, %d after lowering; nothing may be evicted", n, b)
	}
	if err := q.Push(qItem(10, 1, "a", 5)); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("Push above the lowered bound = %v, want ErrQueueFull", err)
	}
	if got := qDrainN(q, 6); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("dispatched %v", got)
	}
	qPush(t, q, qItem(11, 1, "a", 5)) // 4 queued: fits again
	q.SetLimits(QueueLimits{MaxQueued: 100})
	for i := range 20 {
		qPush(t, q, qItem(12+i, 1, "b", 5))
	}
	if n, _ := q.Len(); n != 25 {
		t.Fatalf("Len = %d after raising, want 25", n)
	}
}

func TestQueueStats(t *testing.T) {
	c := newFakeClock()
	q := NewQueue(QueueLimits{MaxQueued: 1000}, c)
	id := 0
	for f := range 15 {
		for range f + 1 { // flow fN has N+1 items in band 1
			qPush(t, q, qItem(id, 1, fmt.Sprintf("f%02d", f), 2))
			id++
		}
	}
	c.Advance(3 * time.Second)
	qPush(t, q, qItem(id, 0, "f00", 4))
	qPush(t, q, qItem(id+1, 0, "zz", 4))
	c.Advance(time.Second)

	s := q.Stats()
	if s.Queued != 122 || s.Bytes != 2*120+8 || s.FlowCount != 16 {
		t.Fatalf("Stats totals %d, %d, %d flows", s.Queued, s.Bytes, s.FlowCount)
	}
	want := []BandStats{
		{Priority: 0, Queued: 2, Bytes: 8, Flows: 2, OldestWait: time.Second},
		{Priority: 1, Queued: 120, Bytes: 240, Flows: 15, OldestWait: 4 * time.Second},
	}
	if !slices.Equal(s.Bands, want) {
		t.Fatalf("Bands = %+v, want %+v", s.Bands, want)
	}
	if len(s.Flows) != 10 || s.Flows[0] != (Backlog{"f14", 15}) || s.Flows[9] != (Backlog{"f05", 6}) {
		t.Fatalf("Flows = %+v", s.Flows)
	}
	// A flow's count is summed over the bands; ties go by name.
	q2 := NewQueue(QueueLimits{MaxQueued: 10}, c)
	qPush(t, q2, qItem(0, 0, "b", 0))
	qPush(t, q2, qItem(1, 1, "b", 0))
	qPush(t, q2, qItem(2, 1, "a", 0))
	qPush(t, q2, qItem(3, 2, "a", 0))
	qPush(t, q2, qItem(4, 2, "c", 0))
	if got, want := q2.Stats().Flows, []Backlog{{"a", 2}, {"b", 2}, {"c", 1}}; !slices.Equal(got, want) {
		t.Fatalf("Flows = %+v, want %+v", got, want)
	}
	qDrain(q2)
	if s := q2.Stats(); s.Queued != 0 || len(s.Bands) != 0 || len(s.Flows) != 0 {
		t.Fatalf("Stats of an empty queue = %+v", s)
	}
}

// --- concurrency ---

func TestQueueDispatchRacesCancel(t *testing.T) {
	const n = 2000
	q := NewQueue(QueueLimits{MaxQueued: n}, nil)
	items := make([]*Item, n)
	for i := range items {
		items[i] = &Item{Priority: i % 3, Flow: fmt.Sprint("f", i%11), Bytes: 1, Value: qVal{id: i}}
	}

	var dispatched [n]bool // written under the queue's lock, by ready
	var results [n]error
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var dispatcher sync.WaitGroup
	dispatcher.Add(1)
	go func() {
		defer dispatcher.Done()
		rng := rand.New(rand.NewPCG(7, 7))
		for {
			select {
			case <-stop:
				return
			default:
			}
			budget := rng.IntN(20)
			q.Dispatch(func(it *Item) bool {
				if budget == 0 {
					return false
				}
				budget--
				dispatched[qID(it)] = true
				return true
			})
			time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
		}
	}()

	for i, it := range items {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := q.Push(it); err != nil {
				results[i] = err
				return
			}
			if i%2 == 0 {
				go func() {
					time.Sleep(time.Duration(i%97) * time.Microsecond)
					cancel()
				}()
			}
			results[i] = q.Wait(ctx, it)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * qGuard):
		t.Fatal("waiters did not finish")
	}
	close(stop)
	dispatcher.Wait()

	var nd, nc int
	for i, err := range results {
		switch {
		case err == nil:
			nd++
			if !dispatched[i] {
				t.Errorf("item %d: Wait = nil but never dispatched", i)
			}
		case errors.Is(err, context.Canceled):
			nc++
			if dispatched[i] {
				t.Errorf("item %d: dispatched and cancelled", i)
			}
		default:
			t.Errorf("item %d: Wait = %v", i, err)
		}
	}
	if nd+nc != n {
		t.Fatalf("dispatched %d + cancelled %d != %d", nd, nc, n)
	}
	if c := qCountTrue(dispatched[:]); c != nd {
		t.Fatalf("ready accepted %d items, Wait returned nil for %d", c, nd)
	}
	if l, b := q.Len(); l != 0 || b != 0 {
		t.Fatalf("Len = %d, %d at the end", l, b)
	}
	t.Logf("dispatched %d, cancelled %d", nd, nc)
}

func qCountTrue(b []bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

func TestQueueConcurrentPushWait(t *testing.T) {
	// Pushers, waiters, a dispatcher and a Stats reader at once, with
	// shedding and timeouts: every Wait returns, and the queue ends
	// empty.
	q := NewQueue(QueueLimits{MaxQueued: 50, MaxQueuedBytes: 4000, MaxWait: 20 * time.Millisecond}, nil)
	var wg sync.WaitGroup
	var ended atomic.Int64
	stop := make(chan struct{})
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			q.Dispatch(qUpTo(3))
			q.Stats()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	go func() {
		defer bg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			q.SetLimits(QueueLimits{MaxQueued: 20 + int(time.Now().UnixNano()%40), MaxQueuedBytes: 4000, MaxWait: 20 * time.Millisecond})
			time.Sleep(time.Millisecond)
		}
	}()
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				it := &Item{Priority: (g + i) % 4, Flow: fmt.Sprint("f", g%5), Bytes: int64(i % 200), Value: qVal{id: g*1000 + i}}
				if err := q.Push(it); err != nil {
					if !errors.Is(err, ErrQueueFull) {
						t.Errorf("Push = %v", err)
					}
					continue
				}
				switch err := q.Wait(context.Background(), it); {
				case err == nil, errors.Is(err, ErrShed), errors.Is(err, ErrTimeout):
					ended.Add(1)
				default:
					t.Errorf("Wait = %v", err)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	if n, b := q.Len(); n != 0 || b != 0 {
		t.Fatalf("Len = %d, %d at the end", n, b)
	}
	if ended.Load() == 0 {
		t.Fatal("no Wait ended")
	}
}

// --- memory ---

func TestQueueForgetsFlows(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)
	for i := range 1000 {
		qPush(t, q, qItem(i, i%50, fmt.Sprint("f", i), 0))
		if got := qDrain(q); len(got) != 1 {
			t.Fatalf("drain = %v", got)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.bands) != 0 || len(q.freeFlows) > maxFreeFlows || len(q.freeBands) > maxFreeBands {
		t.Fatalf("%d bands, %d free flows, %d free bands", len(q.bands), len(q.freeFlows), len(q.freeBands))
	}
}

func BenchmarkPushDispatch(b *testing.B) {
	const flows, depth = 16, 64
	q := NewQueue(QueueLimits{MaxQueued: flows * depth}, nil)
	names := make([]string, flows)
	for i := range names {
		names[i] = fmt.Sprint("tenant-", i)
	}
	items := make([]Item, flows*depth)
	for i := range items {
		items[i] = Item{Priority: i % 3, Flow: names[i%flows], Bytes: 100, Value: i}
	}
	b.ReportAllocs()
	loops := 0
	for b.Loop() {
		loops++
		for i := range items {
			if err := q.Push(&items[i]); err != nil {
				b.Fatal(err)
			}
		}
		if n := q.Dispatch(qAll); n != len(items) {
			b.Fatalf("Dispatch = %d", n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(loops*len(items)), "ns/item")
}

// Ahead says whether an item pushed now would wait behind anything but
// other flows' turns in its band: a more urgent band, or its own flow.
func TestQueueAhead(t *testing.T) {
	q := NewQueue(QueueLimits{MaxQueued: 10}, nil)
	if q.Ahead(0, "a") {
		t.Fatal("an empty queue has something ahead")
	}
	qPush(t, q, qItem(1, 0, "a", 0))
	qPush(t, q, qItem(2, 5, "b", 0))
	for _, c := range []struct {
		prio int
		flow string
		want bool
	}{
		{0, "a", true},   // its own flow waits
		{0, "b", false},  // only another flow's turn
		{-1, "a", false}, // more urgent than all
		{3, "c", true},   // band 0 is more urgent
		{5, "b", true},   // both
		{9, "z", true},
	} {
		if got := q.Ahead(c.prio, c.flow); got != c.want {
			t.Errorf("Ahead(%d, %q) = %v, want %v", c.prio, c.flow, got, c.want)
		}
	}
	qDrain(q)
	if q.Ahead(5, "b") {
		t.Error("a drained queue has something ahead")
	}
}
