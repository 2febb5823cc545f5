package radix

import (
	"bytes"
	"cmp"
	"slices"
	"unsafe"
)

// holder records that a replica holds a node and when it last used it.
type holder struct {
	r    ReplicaID
	last int64 // unix nanoseconds
}

// node is one edge of the tree together with the node it leads to. Nodes are
// only ever used by pointer: holders may point into the node's own inline
// array, so a copied node would alias it.
type node struct {
	label    []uint32 // never empty except at the root; owned by the tree
	parent   *node    // nil at the root and once the node is removed
	children []edge   // sorted by tok, unless index is set
	holders  []holder // sorted by r; usually inline[:1:1]
	inline   [1]holder
	// index maps each child's first token to its place in children once a
	// node has more than indexAt children (children are then kept in no
	// particular order), so that adding a child to a wide node, such as the
	// end of a system prompt shared by many unrelated questions, costs the
	// same however many children it has.
	index map[uint32]int32
}

// edge links a node to a child. The child's first token is kept beside the
// pointer so that looking up a child among many stays within one array.
type edge struct {
	tok uint32 // n.label[0]
	n   *node
}

// newLeaf returns a node under parent holding a copy of label, held by r.
func (t *Tree) newLeaf(parent *node, label []uint32, r ReplicaID, ts int64) *node {
	c := &node{parent: parent, label: cloneExact(label)}
	c.inline[0] = holder{r: r, last: ts}
	c.holders = c.inline[:1:1]
	t.nodes++
	t.tokens += int64(len(label))
	t.holderEntries++
	return c
}

// extendable reports whether Insert may append a tail of add tokens for r
// to n's label in place: n is a leaf that r alone holds, so no other
// replica's record or time is widened by it (its last-used time is already
// now), and the label stays within maxGrownLabel.
func (t *Tree) extendable(n *node, r ReplicaID, add int) bool {
	return n != t.root && len(n.children) == 0 && len(n.holders) == 1 && n.holders[0].r == r &&
		len(n.label)+add <= maxGrownLabel
}

// maxGrownLabel bounds the labels that Insert grows in place, in key values: a
// longer conversation continues in a new leaf. It keeps a grown label's
// allocation within Go's small size classes (below 32 KiB with growth
// rounding), the cost of its growth copies low, and eviction's unit (a
// leaf) fine enough.
const maxGrownLabel = 4096

// extend appends rest to the leaf n's label. A full label doubles its
// capacity (up to maxGrownLabel), so a conversation's turns cost amortised
// copies of their own tokens; the spare capacity is counted in the memory
// estimate.
func (t *Tree) extend(n *node, rest []uint32) {
	t.spare -= slack(n.label)
	if need := len(n.label) + len(rest); need > cap(n.label) {
		n.label = slices.Grow(n.label, min(max(2*cap(n.label), need), maxGrownLabel)-len(n.label))
	}
	n.label = append(n.label, rest...)
	t.spare += slack(n.label)
	t.tokens += int64(len(rest))
}

// slack is the spare capacity of a label, in tokens.
func slack(label []uint32) int64 { return int64(cap(label) - len(label)) }

// split cuts n.children[i] after m tokens (0 < m < len(label)) and returns the
// new upper node; the original node becomes its only child with the rest of
// the label. Both parts keep the same holders and times. Both labels are fresh
// copies, so no part keeps the other's tokens alive.
func (t *Tree) split(n *node, i, m int) *node {
	c := n.children[i].n
	up := &node{parent: n, label: cloneExact(c.label[:m]), children: []edge{{tok: c.label[m], n: c}}}
	up.setHolders(c.holders)
	t.spare -= slack(c.label)
	c.label = cloneExact(c.label[m:])
	c.parent = up
	n.children[i].n = up
	t.nodes++
	t.holderEntries += int64(len(c.holders))
	return up
}

// merge merges into x the chain of single children below it that have the
// same holders and times as x, so that nothing is lost. x keeps its place in its parent and takes over the label
// tails and the children of the last node merged; the merged nodes are
// marked removed. The new label is allocated at its exact size and each
// token copied once, however long the chain.
func (t *Tree) merge(x *node) {
	if x == t.root || x.parent == nil {
		return
	}
	n, last := len(x.label), x
	for len(last.children) == 1 {
		c := last.children[0].n
		if !slices.Equal(x.holders, c.holders) {
			break
		}
		n += len(c.label)
		last = c
	}
	if last == x {
		return
	}
	label := make([]uint32, len(x.label), n)
	copy(label, x.label)
	t.spare -= slack(x.label)
	for c := x.children[0].n; ; {
		label = append(label, c.label...)
		t.spare -= slack(c.label)
		t.nodes--
		t.holderEntries -= int64(len(c.holders))
		children := c.children
		index := c.index
		c.parent, c.children, c.holders, c.label, c.index = nil, nil, nil, nil, nil
		if c == last {
			x.children, x.index = children, index
			break
		}
		c = children[0].n
	}
	x.label = label
	for _, g := range x.children {
		g.n.parent = x
	}
}

// cloneExact returns a copy of s whose capacity equals its length. (append
// skips the zeroing that make would do before the copy.)
func cloneExact(s []uint32) []uint32 {
	return slices.Clip(append([]uint32(nil), s...))
}

// dropReplica removes r from start and from every descendant holding it
// (start may be the root), takes the tokens released off r's count and
// marks nodes left without holders removed. The caller must call finish.
func (t *Tree) dropReplica(start *node, r ReplicaID) {
	var released int64
	changed := t.changed[:0]
	stack := append(t.stack[:0], start)
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack[len(stack)-1] = nil
		stack = stack[:len(stack)-1]
		if x != t.root {
			j, ok := x.holderIndex(r)
			if !ok {
				continue
			}
			x.holders = slices.Delete(x.holders, j, j+1)
			x.shrinkHolders()
			t.holderEntries--
			released += int64(len(x.label))
			changed = append(changed, x) // pre-order: parents before children
		}
		for _, e := range x.children {
			if e.n.holds(r) {
				stack = append(stack, e.n)
			}
		}
	}
	t.stack = stack[:0]
	t.held[r] -= released
	t.sweep(changed)
	clear(changed)
	t.changed = changed[:0]
}

// sweep finishes a removal of holder entries. changed lists, parents before
// children, every node that lost an entry. Nodes left without holders are
// marked removed (with prefix-closure their whole subtree is empty and listed
// too); unlinking them from their parents and re-merging is left to finish.
func (t *Tree) sweep(changed []*node) {
	for _, x := range changed {
		if len(x.holders) > 0 {
			t.cands = append(t.cands, x)
			continue
		}
		t.nodes--
		t.tokens -= int64(len(x.label))
		t.spare -= slack(x.label)
		if p := x.parent; p == t.root || (p != nil && len(p.holders) > 0) {
			t.markGone(p, x)
		}
		x.parent = nil
	}
	// Children of removed nodes are removed too; drop the links in a second
	// pass so the first can still see which parents are being removed.
	for _, x := range changed {
		if len(x.holders) == 0 {
			x.children = nil
			t.dropIndex(x)
		}
	}
}

// finish completes a mutation that removed nodes or holders: it unlinks the
// removed nodes from the parents recorded in t.dirty, each parent compacted
// once however many children it lost (so evicting many leaves under a node
// with a large fan-out stays linear), then re-merges the nodes that lost a
// holder or a child where possible. Until finish runs, removed nodes stay in
// their parent's child slice, marked by a nil parent and no holders.
func (t *Tree) finish() {
	dirty := t.dirty
	if len(dirty) > 1 {
		slices.SortFunc(dirty, func(a, b *node) int {
			return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b)))
		})
		dirty = slices.Compact(dirty)
	}
	t.unlinkGone()
	for _, p := range dirty {
		if p != t.root && p.parent == nil {
			continue // removed itself
		}
		w := p.compact()
		clear(p.children[w:])
		switch {
		case w == 0:
			p.children = nil
		case cap(p.children) > 2*w+8:
			p.children = slices.Clone(p.children[:w])
		default:
			p.children = p.children[:w]
		}
		if p.index != nil && w <= indexAt/2 {
			t.dropIndex(p)
			slices.SortFunc(p.children, func(a, b edge) int { return cmp.Compare(a.tok, b.tok) })
		}
	}
	// A node that absorbed its child may now match its new only child (the
	// child was itself a candidate), hence the inner loops.
	for _, p := range dirty {
		t.merge(p)
	}
	for _, x := range t.cands {
		t.merge(x)
	}
	clear(t.dirty)
	t.dirty = t.dirty[:0]
	clear(t.cands)
	t.cands = t.cands[:0]
}

// childIndex returns the index of the child whose label starts with tok, or
// the index where it would be inserted and false.
func (n *node) childIndex(tok uint32) (int, bool) {
	if n.index != nil {
		i, ok := n.index[tok]
		if !ok {
			return len(n.children), false
		}
		return int(i), true
	}
	cs := n.children
	lo, hi := 0, len(cs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if cs[mid].tok < tok {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(cs) && cs[lo].tok == tok
}

// compact moves n's live children (those whose parent is still n) to the
// front of n.children, keeping their order, and returns their number. An
// indexed parent has had its removed children unlinked by unlinkGone
// already (finish keeps the index until half of indexAt children are left,
// so a node whose fan-out hovers at indexAt does not switch back and forth).
func (n *node) compact() int {
	cs := n.children
	if n.index != nil {
		return len(cs)
	}
	w := 0
	for _, c := range cs {
		if c.n.parent == n {
			cs[w] = c
			w++
		}
	}
	return w
}

// holderIndex returns the index of r's entry, or where it would be inserted and false.
func (n *node) holderIndex(r ReplicaID) (int, bool) {
	hs := n.holders
	lo, hi := 0, len(hs)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if hs[mid].r < r {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo, lo < len(hs) && hs[lo].r == r
}

func (n *node) holds(r ReplicaID) bool {
	_, ok := n.holderIndex(r)
	return ok
}

// setHolders sets n's holders to a copy of hs, inline when there is one.
func (n *node) setHolders(hs []holder) {
	if len(hs) == 1 {
		n.inline[0] = hs[0]
		n.holders = n.inline[:1:1]
		return
	}
	n.holders = slices.Clone(hs)
}

// shrinkHolders moves a single remaining holder back inline, drops the slice
// of a node left without holders, and reallocates a heap slice that has become
// mostly empty.
func (n *node) shrinkHolders() {
	switch l := len(n.holders); {
	case l == 0:
		n.holders = nil
	case l == 1:
		if unsafe.SliceData(n.holders) != &n.inline[0] {
			n.setHolders(n.holders)
		}
	case cap(n.holders) > 2*l+8:
		n.holders = slices.Clone(n.holders)
	}
}

// lcpChunk is the block size, in tokens, compared at once by lcp.
const lcpChunk = 64

// lcp returns the length of the longest common prefix of a and b. Whole
// blocks are compared with the runtime's vectorised memequal; the first
// differing block is then scanned token by token.
func lcp(a, b []uint32) int {
	n := min(len(a), len(b))
	i := 0
	for ; i+lcpChunk <= n; i += lcpChunk {
		if !bytes.Equal(asBytes(a[i:i+lcpChunk]), asBytes(b[i:i+lcpChunk])) {
			break
		}
	}
	for ; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// asBytes views s as bytes without copying.
func asBytes(s []uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*4)
}
