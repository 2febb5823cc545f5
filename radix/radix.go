// Package radix is kvroute's global prefix index: a compressed radix tree over
// token sequences ([]uint32) that records, for every stored prefix, which
// replicas are believed to hold it in their KV cache and when each last used it.
//
// The router uses it on every request: [Tree.MatchInto] the prompt's tokens,
// pick a replica, [Tree.Insert] the choice, and [Tree.Undo] the record if the
// request failed before any response byte reached the client.
//
// # Model
//
// Holdings are prefix-closed: a replica holds a node only if it holds every
// ancestor, and removing a replica from a node removes it from the whole
// subtree below. Every token of a node shares one last-used time per holder,
// and a node's time for a replica is never older than its children's
// (touching a path sets last-used = max(old, now) on every node of it).
//
// Insert only ever splits nodes, adds leaves, and grows a leaf that the
// inserting replica alone holds by appending to its label; it never merges,
// so that a conversation growing turn by turn costs an amortised copy of the
// new turn's tokens only, not of the whole path. A chain of nodes with
// identical holders and times is therefore allowed, and a label may have
// spare capacity (counted in [Stats.Bytes]). Removals (Undo, eviction,
// RemoveReplica) merge the nodes they touch where that loses nothing: a
// parent with a single child whose holders and last-used times are
// identical.
//
// # Bounds
//
// Each replica has a token budget ([Tree.SetBudget], default
// [Options.DefaultBudget]); the whole tree has an estimated byte bound
// ([Options.MaxBytes]). When a bound is exceeded, eviction runs in a batch:
// it collects the k candidates once (the nodes the replica holds, or all
// nodes), orders them by last-used time, deepest first among equal times (so
// each node is a leaf by the time its turn comes), and evicts in that order
// down to 90% of the bound. Ordering selects the oldest eighth in linear time
// and sorts only that, and removed nodes are unlinked from their parents in
// one pass at the end, so a batch costs about O(k + k/8 log k) and frees 10%
// of the bound: its cost is amortised over the insertions that refilled it.
// A replica's batch visits only that replica's nodes; a global batch visits
// every node (tens of milliseconds for half a million nodes), once per 10% of
// MaxBytes inserted. A replica's batch takes from the last leaf it needs only
// that leaf's tail, what brings the replica to the low-water mark, as an
// engine evicts a prefix's last blocks first: a conversation's long history
// in one leaf is not forgotten whole for a few blocks. A global batch drops
// leaves whole and may release more than strictly needed.
//
// # Concurrency and copying
//
// A *Tree is safe for concurrent use: MatchInto and Stats take a read lock,
// everything else the write lock. A Tree must not be copied after first use.
// The tree never retains a caller's slice: Insert copies the tokens it
// stores, and MatchInto only appends to dst. Callers may reuse or mutate key
// buffers as soon as a call returns.
package radix

import (
	"math"
	"slices"
	"sync"
	"time"
)

// ReplicaID identifies a replica in the tree. IDs are small dense integers
// (0..n) assigned by the caller: per-replica state is kept in slices indexed
// by ReplicaID, so a huge ID costs memory proportional to its value.
type ReplicaID uint32

// Defaults applied by [New] for zero [Options] fields.
const (
	// DefaultMaxBytes is the estimated-memory bound used when Options.MaxBytes is 0.
	DefaultMaxBytes int64 = 256 << 20
	// DefaultBudget is the per-replica token budget used when Options.DefaultBudget is 0.
	DefaultBudget int64 = 400_000
)

// Options configures a [Tree]. The zero value is valid and selects the defaults.
type Options struct {
	// MaxBytes bounds the tree's estimated memory in bytes (see [Stats.Bytes]).
	// 0 means DefaultMaxBytes (256 MiB).
	MaxBytes int64
	// DefaultBudget is the per-replica token budget for replicas whose budget
	// was never set with SetBudget. 0 means DefaultBudget (400,000 tokens).
	DefaultBudget int64
	// Unit is the number of prompt tokens each key value stands for (a key
	// of block hashes has one value per block). Lengths the tree reports
	// (Match.Tokens, Stats.Tokens, Stats.Held) and budgets it is given are
	// in tokens, converted at this rate; its own counts are of key values.
	// 0 means 1.
	Unit int
}

// Match reports how much of a key one replica holds. It is a plain value.
type Match struct {
	// Replica is the holder.
	Replica ReplicaID
	// Tokens is the length of the longest prefix of the key that Replica holds.
	Tokens int
}

// Stats is a snapshot of the tree's size, returned by [Tree.Stats]. It owns
// its Held map; the caller may keep and modify it.
type Stats struct {
	// Nodes is the number of nodes, excluding the empty root.
	Nodes int
	// Tokens is the total number of tokens stored in edge labels.
	Tokens int64
	// Bytes is the estimated memory of the tree: per node NodeBytes (node
	// struct with one inline holder, its slot in the parent's child slice and
	// allocation slack), 4 bytes per stored token and per token of spare
	// capacity in grown leaf labels, HolderBytes for every holder entry
	// beyond the first of a node, and IndexBytes for every child of a node
	// wide enough to index its children. The estimate tracks
	// runtime.MemStats within about 10% (see BenchmarkBytesPerToken).
	Bytes int64
	// Held maps each replica holding anything to the number of tokens it
	// holds: the sum of label lengths over the nodes it holds.
	Held map[ReplicaID]int64
}

// Constants of the memory estimate reported in [Stats.Bytes] and bounded by
// [Options.MaxBytes].
const (
	// NodeBytes is the estimated fixed cost of one node: the 104-byte node
	// struct (label, parent, children and holder slice headers, one inline
	// holder and the index pointer) in its 112-byte size class, and its
	// 16-byte edge in the parent's child slice.
	NodeBytes = 128
	// HolderBytes is the estimated cost of each holder entry beyond the first
	// of a node: a 16-byte {replica, last-used} pair plus append growth once a
	// node's holders spill from the inline slot to a heap slice.
	HolderBytes = 24
	// TokenBytes is the cost of one stored token.
	TokenBytes = 4
	// IndexBytes is the estimated cost of one entry of a wide node's child
	// index: an 8-byte {token, place} slot of a Go map, whose tables run
	// between 7/16 and 7/8 full, with their control bytes.
	IndexBytes = 16
)

// Tree is the global prefix index. Create it with [New]; the zero value is not
// usable. It is safe for concurrent use and must not be copied.
type Tree struct {
	mu sync.RWMutex

	root      *node
	maxBytes  int64
	defBudget int64 // in key values, as budget and held
	unit      int64 // tokens per key value

	budget []int64 // by ReplicaID; 0 = defBudget
	held   []int64 // by ReplicaID: tokens held

	nodes         int   // excluding root
	tokens        int64 // sum of label lengths
	spare         int64 // sum of labels' spare capacities, in tokens
	holderEntries int64 // sum of len(holders)
	indexed       int64 // sum of len(index)

	// Scratch buffers reused by mutations (guarded by the write lock).
	stack   []*node
	changed []*node
	lru     []lruEntry
	// Work left to finish by the current mutation: parents with removed
	// children, and nodes to try to re-merge.
	dirty []*node
	cands []*node
	// Children removed from indexed parents, unlinked by finish through
	// the index rather than by a scan of all the parent's children.
	gone []goneChild
}

// New returns an empty tree configured by opts.
func New(opts Options) *Tree {
	t := &Tree{root: &node{}, maxBytes: opts.MaxBytes, defBudget: opts.DefaultBudget, unit: int64(max(opts.Unit, 1))}
	if t.maxBytes <= 0 {
		t.maxBytes = DefaultMaxBytes
	}
	if t.defBudget <= 0 {
		t.defBudget = DefaultBudget
	}
	t.defBudget = t.values(t.defBudget)
	return t
}

// sameActive reports whether a node's holders passing the notBefore filter are
// exactly the active replicas. Holders of a child are a subset of its
// parent's, with times no newer, so equal counts mean equal sets.
func sameActive(hs []holder, active int, nb int64) bool {
	if len(hs) != active {
		return false
	}
	if nb != math.MinInt64 {
		for _, h := range hs {
			if h.last < nb {
				return false
			}
		}
	}
	return true
}

// nanos converts t to unix nanoseconds; the zero Time maps to the smallest
// value so that it compares before every real time. Times before 1678 or after
// 2262 are not representable.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.UnixNano()
}

// MatchInto appends to dst[:0] one Match per replica that holds at least one
// token of a prefix of key, with Tokens the length of the longest such prefix,
// and returns the extended slice. Holder entries last used before notBefore
// are ignored (pass time.Time{} to count all). The order of the result is
// unspecified but not random (it tends to follow ReplicaID): callers must not
// use it to break ties. MatchInto does not allocate when dst has enough capacity (one
// entry per replica) and does not retain key or dst.
func (t *Tree) MatchInto(dst []Match, key []uint32, notBefore time.Time) []Match {
	dst = dst[:0]
	nb := nanos(notBefore)
	t.mu.RLock()
	defer t.mu.RUnlock()

	// dst[:active] are the replicas holding every node so far, sorted by
	// Replica; their Tokens are filled in when they drop out or at the end.
	// active is -1 before the first node.
	n, depth, end, active := t.root, 0, 0, -1
	for depth < len(key) {
		i, ok := n.childIndex(key[depth])
		if !ok {
			break
		}
		c := n.children[i].n
		m := lcp(c.label, key[depth:])
		hs := c.holders
		if active < 0 {
			for _, h := range hs {
				if h.last >= nb {
					dst = append(dst, Match{Replica: h.r})
				}
			}
			active = len(dst)
		} else if !sameActive(hs, active, nb) {
			// c's holders are a subset of the active ones, both sorted by
			// replica: one merge pass finalises those that drop out here and
			// moves the survivors to the front.
			w, hi := 0, 0
			for j := 0; j < active; j++ {
				id := dst[j].Replica
				for hi < len(hs) && hs[hi].r < id {
					hi++
				}
				if hi < len(hs) && hs[hi].r == id && hs[hi].last >= nb {
					if w != j {
						dst[w], dst[j] = dst[j], dst[w]
					}
					w++
				} else {
					dst[j].Tokens = depth * int(t.unit)
				}
			}
			active = w
		}
		end = depth + m
		if active == 0 || m < len(c.label) {
			break
		}
		n, depth = c, end
	}
	for j := 0; j < active; j++ {
		dst[j].Tokens = end * int(t.unit)
	}
	return dst
}

// Insert records that replica r holds key and all its prefixes, setting
// last-used = now (or keeping a later time already recorded) on every node of
// the path. It returns how many leading values of key r already held before
// the call (not scaled by Options.Unit), to pass to [Tree.Undo] as keep. The
// tree copies the values it stores; key is not retained.
//
// Afterwards Insert enforces r's token budget (evicting r from its least
// recently used leaves) and the global MaxBytes bound (evicting the globally
// least recently used leaves), so the inserted tokens themselves may be
// evicted if they exceed a bound. An empty key is a no-op.
func (t *Tree) Insert(key []uint32, r ReplicaID, now time.Time) (alreadyHeld int) {
	if len(key) == 0 {
		return 0
	}
	ts := nanos(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.growReplicas(r)

	n, depth := t.root, 0
	for depth < len(key) {
		rest := key[depth:]
		i, ok := n.childIndex(rest[0])
		var c *node
		if !ok {
			t.held[r] += int64(len(rest))
			if t.extendable(n, r, len(rest)) {
				// The next turn of a conversation that stayed on r: its
				// tail joins r's leaf instead of hanging below it.
				t.extend(n, rest)
				break
			}
			c = t.newLeaf(n, rest, r, ts)
			t.addChild(n, i, edge{tok: rest[0], n: c})
			depth = len(key)
		} else {
			c = n.children[i].n
			m := lcp(c.label, rest)
			if m < len(c.label) {
				c = t.split(n, i, m)
			}
			if j, has := c.holderIndex(r); has {
				// Prefix-closure: r holding c means it held the whole path so far.
				alreadyHeld += m
				if ts > c.holders[j].last {
					c.holders[j].last = ts
				}
			} else {
				c.holders = slices.Insert(c.holders, j, holder{r: r, last: ts})
				t.holderEntries++
				t.held[r] += int64(m)
			}
			depth += m
		}
		n = c
	}

	if b := t.budgetOf(r); t.held[r] > b {
		t.evictReplica(r, lowWater(b))
		t.finish()
	}
	if t.bytesEstimate() > t.maxBytes {
		t.evictGlobal(lowWater(t.maxBytes))
		t.finish()
	}
	return alreadyHeld
}

// Touch sets last-used = now (or keeps a later time) on the prefix of key
// that r holds, from the root down, and returns its length in key values.
// Unlike Insert it adds nothing: what r no longer holds stays forgotten. A
// node whose label runs past the held prefix is split there, so that the
// tokens past it keep their time. An empty key is a no-op.
func (t *Tree) Touch(key []uint32, r ReplicaID, now time.Time) (held int) {
	ts := nanos(now)
	t.mu.Lock()
	defer t.mu.Unlock()
	n, depth := t.root, 0
	for depth < len(key) {
		c, i, j, m, ok := heldChild(n, key, depth, r)
		if !ok {
			break
		}
		if m < len(c.label) {
			c = t.split(n, i, m)
			j, _ = c.holderIndex(r)
		}
		if ts > c.holders[j].last {
			c.holders[j].last = ts
		}
		n, depth = c, depth+m
	}
	if t.bytesEstimate() > t.maxBytes {
		t.evictGlobal(lowWater(t.maxBytes))
		t.finish()
	}
	return depth
}

// heldChild is one step of a walk down key along what r holds, as Touch
// and Undo take: the child c of n that key[depth] leads to, its index i
// among n's children, the index j of r among c's holders, and how many
// values of c's label key matches from depth (m). ok is false where the
// walk ends: n has no such child, or r does not hold it.
func heldChild(n *node, key []uint32, depth int, r ReplicaID) (c *node, i, j, m int, ok bool) {
	if i, ok = n.childIndex(key[depth]); !ok {
		return nil, 0, 0, 0, false
	}
	c = n.children[i].n
	if j, ok = c.holderIndex(r); !ok {
		return nil, 0, 0, 0, false
	}
	return c, i, j, lcp(c.label, key[depth:]), true
}

// Undo removes replica r as holder of the tokens of key beyond the first keep,
// normally keep = the alreadyHeld returned by the Insert being undone. By
// prefix-closure this also removes r from every longer key that shares more
// than keep tokens with key, including ones recorded by other requests since.
// This errs towards forgetting, never towards phantom hits. Nodes left with no
// holder are deleted. key is not retained.
func (t *Tree) Undo(key []uint32, r ReplicaID, keep int) {
	keep = max(keep, 0)
	if keep >= len(key) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()

	n, depth := t.root, 0
	for depth < len(key) {
		c, i, _, m, ok := heldChild(n, key, depth, r)
		if !ok {
			return
		}
		if depth+m > keep {
			if keep > depth {
				c = t.split(n, i, keep-depth).children[0].n
			}
			t.dropReplica(c, r)
			t.finish()
			return
		}
		if m < len(c.label) {
			return
		}
		n, depth = c, depth+m
	}
}

// RemoveReplica drops all of r's holdings, e.g. when the replica leaves or
// restarts with an empty cache. Its budget setting is kept.
func (t *Tree) RemoveReplica(r ReplicaID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if int(r) >= len(t.held) || t.held[r] == 0 {
		return
	}
	t.dropReplica(t.root, r)
	t.finish()
}

// SetBudget sets r's token budget, normally the replica's real KV capacity in
// tokens (num_gpu_blocks × block_size). If r holds more, its least recently
// used leaves are evicted down to 90% of the budget. tokens <= 0 restores the
// default budget.
func (t *Tree) SetBudget(r ReplicaID, tokens int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.growReplicas(r)
	t.budget[r] = t.values(max(tokens, 0))
	if b := t.budgetOf(r); t.held[r] > b {
		t.evictReplica(r, lowWater(b))
		t.finish()
	}
}

// EvictBefore removes every holder entry last used before cutoff, deletes the
// nodes left without holders, and returns the number of tokens released (the
// sum of label lengths over the removed entries). It visits the whole tree;
// call it periodically, not per request.
func (t *Tree) EvictBefore(cutoff time.Time) int {
	cut := nanos(cutoff)
	t.mu.Lock()
	defer t.mu.Unlock()

	var released int64
	changed := t.changed[:0]
	stack := append(t.stack[:0], t.root)
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack[len(stack)-1] = nil
		stack = stack[:len(stack)-1]
		for _, e := range x.children {
			c := e.n
			l := int64(len(c.label))
			w := 0
			for _, h := range c.holders {
				// The second test keeps closure even if times were out of order.
				if h.last < cut || (x != t.root && !x.holds(h.r)) {
					t.held[h.r] -= l
					released += l
					continue
				}
				c.holders[w] = h
				w++
			}
			if w < len(c.holders) {
				t.holderEntries -= int64(len(c.holders) - w)
				c.holders = c.holders[:w]
				c.shrinkHolders()
				changed = append(changed, c)
			}
			stack = append(stack, c)
		}
	}
	t.stack = stack[:0]
	t.sweep(changed)
	clear(changed)
	t.changed = changed[:0]
	t.finish()
	return int(released * t.unit)
}

// Stats returns a snapshot of the tree's size.
func (t *Tree) Stats() Stats {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := Stats{
		Nodes:  t.nodes,
		Tokens: t.tokens * t.unit,
		Bytes:  t.bytesEstimate(),
		Held:   make(map[ReplicaID]int64),
	}
	for r, h := range t.held {
		if h != 0 {
			s.Held[ReplicaID(r)] = h * t.unit
		}
	}
	return s
}

// bytesEstimate implements the formula documented on Stats.Bytes.
func (t *Tree) bytesEstimate() int64 {
	return int64(t.nodes)*NodeBytes + (t.tokens+t.spare)*TokenBytes +
		(t.holderEntries-int64(t.nodes))*HolderBytes + t.indexed*IndexBytes
}

// lowWater is the level a batch eviction brings a bound down to.
func lowWater(bound int64) int64 { return bound - bound/10 }

// values converts a budget in tokens to key values, rounding down but
// keeping a positive budget positive.
func (t *Tree) values(tokens int64) int64 {
	if tokens <= 0 {
		return tokens
	}
	return max(tokens/t.unit, 1)
}

func (t *Tree) budgetOf(r ReplicaID) int64 {
	if b := t.budget[r]; b > 0 {
		return b
	}
	return t.defBudget
}

func (t *Tree) growReplicas(r ReplicaID) {
	if int(r) < len(t.held) {
		return
	}
	n := int(r) + 1
	t.held = slices.Grow(t.held, n-len(t.held))[:n]
	t.budget = slices.Grow(t.budget, n-len(t.budget))[:n]
}
