package radix

import "slices"

// indexAt is the fan-out above which a node indexes its children by a map.
// Below it a sorted slice is as fast to search and cheap to insert into.
const indexAt = 32

// addChild adds e to n's children at i, the place childIndex returned for
// e.tok, indexing them once there are more than indexAt.
func (t *Tree) addChild(n *node, i int, e edge) {
	switch {
	case n.index != nil:
		n.index[e.tok] = int32(len(n.children))
		n.children = append(n.children, e)
		t.indexed++
	case len(n.children) < indexAt:
		n.children = slices.Insert(n.children, i, e)
	default:
		n.children = append(n.children, e)
		n.index = make(map[uint32]int32, len(n.children))
		for j, c := range n.children {
			n.index[c.tok] = int32(j)
		}
		t.indexed += int64(len(n.index))
	}
}

// goneChild is a child removed from an indexed parent, named by its first
// token.
type goneChild struct {
	p   *node
	tok uint32
}

// markGone records that x, a child of p, has been removed: p is left for
// finish to compact and re-merge, and x for it to unlink from p's index.
func (t *Tree) markGone(p, x *node) {
	t.dirty = append(t.dirty, p)
	if p.index != nil {
		t.gone = append(t.gone, goneChild{p, x.label[0]})
	}
}

// unlinkGone removes the children recorded by markGone from their indexed
// parents, filling each one's place with the parent's last child, so that
// a removal costs the same at any fan-out. Parents removed since have
// dropped their index and are skipped.
func (t *Tree) unlinkGone() {
	for _, g := range t.gone {
		p := g.p
		if p.index == nil {
			continue
		}
		i, ok := p.index[g.tok]
		if !ok || p.children[i].n.parent == p {
			continue // not removed: cannot happen, but never unlink a live child
		}
		delete(p.index, g.tok)
		t.indexed--
		last := int32(len(p.children) - 1)
		if i != last {
			p.children[i] = p.children[last]
			p.index[p.children[i].tok] = i
		}
		p.children[last] = edge{}
		p.children = p.children[:last]
	}
	clear(t.gone)
	t.gone = t.gone[:0]
}

// dropIndex forgets a node's index.
func (t *Tree) dropIndex(n *node) {
	t.indexed -= int64(len(n.index))
	n.index = nil
}
