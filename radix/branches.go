package radix

import "time"

// MaxBranches is the number of children Branches counts at most: a sample
// of a node wide enough to index its children, so that the count costs the
// same at any fan-out.
const MaxBranches = 128

// Branches counts, at the point depth values into key, the continuations
// past it that each replica holds, used at or after notBefore: the children
// of the node that ends there (at most MaxBranches of them, the latest
// added where the node indexes its children, skipping one that continues
// key itself), or the one edge when the point falls inside an edge's
// label. It adds one to dst[r] for each continuation replica r holds,
// growing dst as needed, and returns dst and the number of continuations
// some replica holds. Nothing is counted when the tree does not hold key
// to depth.
func (t *Tree) Branches(dst []int32, key []uint32, depth int, notBefore time.Time) ([]int32, int) {
	if depth <= 0 || depth > len(key) {
		return dst, 0
	}
	nb := nanos(notBefore)
	t.mu.RLock()
	defer t.mu.RUnlock()
	n, d := t.root, 0
	for d < depth {
		i, ok := n.childIndex(key[d])
		if !ok {
			return dst, 0
		}
		c := n.children[i].n
		m := lcp(c.label, key[d:])
		if d+m < depth {
			if m < len(c.label) {
				return dst, 0 // key leaves the tree before depth
			}
			n, d = c, d+m
			continue
		}
		if depth-d < len(c.label) {
			// Inside c's label: its rest is the one continuation.
			dst, ok := countHolders(dst, c, nb)
			if !ok {
				return dst, 0
			}
			return dst, 1
		}
		n, d = c, d+len(c.label)
	}
	seen := 0
	// Newest first: an indexed node keeps its children in the order they
	// were added (addChild; a removed child's place goes to the last one),
	// so past MaxBranches the count is of about the latest continuations,
	// not of the first ones ever made.
	for j := len(n.children) - 1; j >= 0; j-- {
		if seen == MaxBranches {
			break
		}
		e := n.children[j]
		if depth < len(key) && e.tok == key[depth] {
			continue
		}
		var ok bool
		if dst, ok = countHolders(dst, e.n, nb); ok {
			seen++
		}
	}
	return dst, seen
}

// countHolders adds one to dst[r] for each holder r of n used at or after
// nb, and reports whether there was any.
func countHolders(dst []int32, n *node, nb int64) ([]int32, bool) {
	found := false
	for _, h := range n.holders {
		if h.last < nb {
			continue
		}
		for int(h.r) >= len(dst) {
			dst = append(dst, 0)
		}
		dst[h.r]++
		found = true
	}
	return dst, found
}

// Occupancy is what a replica holds in the tree and its budget, in tokens.
type Occupancy struct{ Held, Budget int64 }

// Occupancies appends to dst[:0] the Occupancy of each replica of rs, read
// under one lock.
func (t *Tree) Occupancies(dst []Occupancy, rs []ReplicaID) []Occupancy {
	dst = dst[:0]
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, r := range rs {
		if int(r) >= len(t.held) {
			dst = append(dst, Occupancy{Budget: t.defBudget * t.unit})
			continue
		}
		dst = append(dst, Occupancy{Held: t.held[r] * t.unit, Budget: t.budgetOf(r) * t.unit})
	}
	return dst
}
