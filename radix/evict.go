package radix

import (
	"cmp"
	"iter"
	"slices"
)

// lruEntry is an eviction candidate collected by a batch.
type lruEntry struct {
	n     *node
	last  int64 // the replica's last-used time, or the latest over all holders
	depth int   // in nodes from the root
}

// byAgeDeepestFirst orders candidates oldest first and, among equal times,
// deepest first. A node's time is never older than its descendants', so every
// node comes after its whole subtree: it is a leaf when its turn comes.
func byAgeDeepestFirst(a, b lruEntry) int {
	if c := cmp.Compare(a.last, b.last); c != 0 {
		return c
	}
	return cmp.Compare(b.depth, a.depth)
}

// oldestFirst yields the entries of lru in byAgeDeepestFirst order, sorting
// only as much as the consumer reads: it selects the oldest eighth (linear
// time), sorts and yields it, and moves on to the next eighth only if asked.
// A batch that frees 10% of a bound usually needs one chunk, so it costs
// O(n + n/8 log n) rather than a full sort. It reorders lru.
func oldestFirst(lru []lruEntry) iter.Seq[lruEntry] {
	return func(yield func(lruEntry) bool) {
		chunk := max(len(lru)/8, 256)
		for len(lru) > 0 {
			k := min(chunk, len(lru))
			selectOldest(lru, k)
			slices.SortFunc(lru[:k], byAgeDeepestFirst)
			for _, e := range lru[:k] {
				if !yield(e) {
					return
				}
			}
			lru = lru[k:]
		}
	}
}

// selectOldest rearranges a so that a[:k] holds its k oldest entries, in no
// particular order (quickselect with a three-way partition, so runs of equal
// keys do not degrade it).
func selectOldest(a []lruEntry, k int) {
	for k > 0 && k < len(a) {
		p := medianOf3(a[0], a[len(a)/2], a[len(a)-1])
		lt, i, gt := 0, 0, len(a) // a[:lt] < p, a[lt:i] == p, a[gt:] > p
		for i < gt {
			switch c := byAgeDeepestFirst(a[i], p); {
			case c < 0:
				a[lt], a[i] = a[i], a[lt]
				lt++
				i++
			case c > 0:
				gt--
				a[i], a[gt] = a[gt], a[i]
			default:
				i++
			}
		}
		switch {
		case k < lt:
			a = a[:lt]
		case k <= gt:
			return
		default:
			a, k = a[gt:], k-gt
		}
	}
}

func medianOf3(a, b, c lruEntry) lruEntry {
	if byAgeDeepestFirst(b, a) < 0 {
		a, b = b, a
	}
	if byAgeDeepestFirst(c, b) < 0 {
		b = c
		if byAgeDeepestFirst(b, a) < 0 {
			b = a
		}
	}
	return b
}

// evictReplica removes r from its least recently used leaves until it holds
// at most target tokens; the caller must call finish. It visits only the nodes r holds (prefix-closure makes
// them a subtree hanging from the root), once per batch.
func (t *Tree) evictReplica(r ReplicaID, target int64) {
	lru := t.lru[:0]
	for _, ce := range t.root.children {
		if j, ok := ce.n.holderIndex(r); ok {
			lru = append(lru, lruEntry{n: ce.n, last: ce.n.holders[j].last, depth: 1})
		}
	}
	for i := 0; i < len(lru); i++ { // breadth-first, lru doubles as the queue
		e := lru[i]
		for _, ce := range e.n.children {
			if j, ok := ce.n.holderIndex(r); ok {
				lru = append(lru, lruEntry{n: ce.n, last: ce.n.holders[j].last, depth: e.depth + 1})
			}
		}
	}
	for e := range oldestFirst(lru) {
		if t.held[r] <= target {
			break
		}
		// Skip nodes removed by an earlier step of this batch.
		if e.n.parent == nil || !e.n.holds(r) {
			continue
		}
		if excess := t.held[r] - target; int64(len(e.n.label)) > excess {
			// The last leaf needed (r's children of it went before it,
			// byAgeDeepestFirst): only its tail goes, as an engine
			// evicts the last blocks of a prefix first and keeps the
			// rest. A conversation's long history, a single leaf, is
			// then not forgotten whole for a few blocks.
			p := e.n.parent
			i, _ := p.childIndex(e.n.label[0])
			t.split(p, i, len(e.n.label)-int(excess))
			t.dropReplica(e.n, r)
			break
		}
		t.dropReplica(e.n, r)
	}
	t.releaseLRU(lru)
}

// evictGlobal deletes the globally least recently used leaves (by the latest
// time over their holders) until the byte estimate is at most target; the
// caller must call finish.
func (t *Tree) evictGlobal(target int64) {
	lru := slices.Grow(t.lru[:0], t.nodes)
	for _, ce := range t.root.children {
		lru = append(lru, lruEntry{n: ce.n, last: latest(ce.n), depth: 1})
	}
	for i := 0; i < len(lru); i++ {
		e := lru[i]
		for _, ce := range e.n.children {
			lru = append(lru, lruEntry{n: ce.n, last: latest(ce.n), depth: e.depth + 1})
		}
	}
	for e := range oldestFirst(lru) {
		if t.bytesEstimate() <= target {
			break
		}
		if e.n.parent == nil {
			continue
		}
		t.deleteSubtree(e.n)
	}
	t.releaseLRU(lru)
}

func latest(n *node) int64 {
	l := n.holders[0].last
	for _, h := range n.holders[1:] {
		l = max(l, h.last)
	}
	return l
}

// deleteSubtree marks x and everything below it removed (normally x is a
// leaf), releasing all their holder entries. The caller must call finish.
func (t *Tree) deleteSubtree(x *node) {
	t.markGone(x.parent, x)
	stack := append(t.stack[:0], x)
	for len(stack) > 0 {
		y := stack[len(stack)-1]
		stack[len(stack)-1] = nil
		stack = stack[:len(stack)-1]
		l := int64(len(y.label))
		for _, h := range y.holders {
			t.held[h.r] -= l
		}
		t.holderEntries -= int64(len(y.holders))
		t.nodes--
		t.tokens -= l
		t.spare -= slack(y.label)
		for _, ce := range y.children {
			if ce.n.parent == y { // skip children already removed in this batch
				stack = append(stack, ce.n)
			}
		}
		y.parent, y.children, y.holders = nil, nil, nil
		t.dropIndex(y)
	}
	t.stack = stack[:0]
}

// releaseLRU keeps a batch's scratch slice for the next batch unless it is
// large: a global batch needs one entry per node, and keeping that around
// would add a sixth to the tree's memory between batches.
func (t *Tree) releaseLRU(lru []lruEntry) {
	if cap(lru) > 1<<16 {
		t.lru = nil
		return
	}
	clear(lru)
	t.lru = lru[:0]
}
