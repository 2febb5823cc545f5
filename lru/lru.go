// Package lru is kvroute's one bounded least-recently-used map: the
// session table, the Responses ids, precise's render cache and the token
// cache are each one (or one per shard) under their own lock.
//
// A Cache keeps its entries in a ring, most recently used first, and
// drops from the least recently used end to stay within an entry bound, a
// cost bound (bytes, as the caller counts them), or both. Expiry is the
// caller's: a TTL needs a clock and a rule (idle since the last use, or
// since the last write), which differ between the users; RemoveOldestWhile
// trims by any rule from the old end.
//
// An entry is one allocation holding the links, the key and the value,
// the value inline: a map slot and that entry are all a binding costs.
package lru

// Entry is one key and its value in a Cache. Value may be changed in
// place (which changes neither the order nor, for a cost-bounded Cache,
// the cost: see Options.Cost). An *Entry is valid until the Cache's next
// Put, PutEntry or Remove of it: an entry dropped to make room may be
// reused for another key.
type Entry[K comparable, V any] struct {
	prev, next *Entry[K, V]
	key        K
	Value      V
}

// Key returns the entry's key.
func (e *Entry[K, V]) Key() K { return e.key }

// Options are a Cache's bounds and hooks. The zero value bounds nothing.
type Options[V any] struct {
	// MaxEntries is the most entries held; 0: no bound.
	MaxEntries int
	// MaxCost is the most the entries' costs may sum to; 0: no bound. An
	// entry whose cost alone is over it is not stored.
	MaxCost int64
	// Cost is an entry's cost (its bytes, say), which must not change
	// while the entry is held. nil: every entry costs 0.
	Cost func(V) int64
	// Evicted, if set, is told of each entry dropped to stay within a
	// bound, before it goes (not of those taken out by Remove or
	// RemoveOldestWhile).
	Evicted func(*V)
}

// Cache is a map from K to V bounded by entries, cost or both, least
// recently used out first. Its zero value is not ready: call Init. A Cache
// must not be copied after Init. It is not safe for concurrent use: each
// user guards its Cache with its own lock.
type Cache[K comparable, V any] struct {
	m    map[K]*Entry[K, V]
	root Entry[K, V] // root.next is the most recently used, root.prev the least
	cost int64       // the entries' costs, summed
	opt  Options[V]
}

// Init empties c and sets its bounds and hooks.
func (c *Cache[K, V]) Init(o Options[V]) *Cache[K, V] {
	c.m = make(map[K]*Entry[K, V])
	c.root.prev, c.root.next = &c.root, &c.root
	c.cost = 0
	c.opt = o
	return c
}

// Len returns the number of entries.
func (c *Cache[K, V]) Len() int { return len(c.m) }

// Cost returns the entries' costs, summed.
func (c *Cache[K, V]) Cost() int64 { return c.cost }

// MaxEntries returns the entry bound (0: none).
func (c *Cache[K, V]) MaxEntries() int { return c.opt.MaxEntries }

// MaxCost returns the cost bound (0: none).
func (c *Cache[K, V]) MaxCost() int64 { return c.opt.MaxCost }

// SetBounds changes the bounds, dropping at once, least recently used
// first, the entries beyond them.
func (c *Cache[K, V]) SetBounds(maxEntries int, maxCost int64) {
	c.opt.MaxEntries, c.opt.MaxCost = maxEntries, maxCost
	c.evict()
}

// Peek returns the entry of k, or nil, leaving the order as it is.
func (c *Cache[K, V]) Peek(k K) *Entry[K, V] { return c.m[k] }

// Get returns the entry of k, or nil, making it the most recently used.
func (c *Cache[K, V]) Get(k K) *Entry[K, V] {
	e := c.m[k]
	if e != nil {
		c.Touch(e)
	}
	return e
}

// Touch makes e the most recently used.
func (c *Cache[K, V]) Touch(e *Entry[K, V]) {
	if c.root.next == e {
		return
	}
	c.unlink(e)
	c.pushFront(e)
}

// Put stores v under k as the most recently used, replacing k's value if
// it has one, and drops the least recently used entries beyond the bounds.
// It returns k's entry, or nil, changing nothing, when v's cost alone is
// over the cost bound. A new key at the entry bound takes over the entry
// of the one it drops, allocating nothing.
func (c *Cache[K, V]) Put(k K, v V) *Entry[K, V] {
	if c.tooCostly(v) {
		return nil
	}
	if e := c.m[k]; e != nil {
		c.cost -= c.costOf(e)
		e.Value = v
		c.cost += c.costOf(e)
		c.Touch(e)
		c.evict()
		return e
	}
	var e *Entry[K, V]
	if c.opt.MaxEntries > 0 && len(c.m) >= c.opt.MaxEntries {
		e = c.root.prev
		c.drop(e)
		*e = Entry[K, V]{}
	} else {
		e = new(Entry[K, V])
	}
	e.Value = v
	c.insert(k, e)
	return e
}

// PutEntry is Put of an entry the caller allocated with its Value set, so
// that the entry may share one allocation with what its value points to
// (a struct embedding the Entry). The Cache holds e from now on, unless it
// returns nil (e's cost alone is over the cost bound).
func (c *Cache[K, V]) PutEntry(k K, e *Entry[K, V]) *Entry[K, V] {
	if c.tooCostly(e.Value) {
		return nil
	}
	if old := c.m[k]; old != nil {
		c.Remove(old)
	}
	c.insert(k, e)
	return e
}

func (c *Cache[K, V]) insert(k K, e *Entry[K, V]) {
	e.key = k
	c.m[k] = e
	c.cost += c.costOf(e)
	c.pushFront(e)
	c.evict()
}

// Remove takes e out of the Cache.
func (c *Cache[K, V]) Remove(e *Entry[K, V]) {
	c.unlink(e)
	delete(c.m, e.key)
	c.cost -= c.costOf(e)
}

// Oldest returns the least recently used entry, or nil.
func (c *Cache[K, V]) Oldest() *Entry[K, V] {
	if e := c.root.prev; e != &c.root {
		return e
	}
	return nil
}

// RemoveOldestWhile removes entries from the least recently used while
// drop says so, at most limit of them (below 0: no limit), and returns how
// many it removed.
func (c *Cache[K, V]) RemoveOldestWhile(limit int, drop func(*Entry[K, V]) bool) int {
	n := 0
	for e := c.root.prev; e != &c.root && n != limit && drop(e); e = c.root.prev {
		c.Remove(e)
		n++
	}
	return n
}

// RemoveFunc removes every entry for which drop is true, and returns how
// many it removed.
func (c *Cache[K, V]) RemoveFunc(drop func(*Entry[K, V]) bool) int {
	n := 0
	for e := c.root.next; e != &c.root; {
		next := e.next
		if drop(e) {
			c.Remove(e)
			n++
		}
		e = next
	}
	return n
}

// evict drops the least recently used entries while the Cache is over a
// bound. Since no entry costs more than the cost bound alone (tooCostly),
// the newest stays.
func (c *Cache[K, V]) evict() {
	for len(c.m) > 0 && (c.opt.MaxEntries > 0 && len(c.m) > c.opt.MaxEntries || c.opt.MaxCost > 0 && c.cost > c.opt.MaxCost) {
		c.drop(c.root.prev)
	}
}

// tooCostly reports whether v alone is over the cost bound.
func (c *Cache[K, V]) tooCostly(v V) bool {
	return c.opt.MaxCost > 0 && c.opt.Cost != nil && c.opt.Cost(v) > c.opt.MaxCost
}

// drop is Remove of an entry dropped for a bound.
func (c *Cache[K, V]) drop(e *Entry[K, V]) {
	if c.opt.Evicted != nil {
		c.opt.Evicted(&e.Value)
	}
	c.Remove(e)
}

func (c *Cache[K, V]) costOf(e *Entry[K, V]) int64 {
	if c.opt.Cost == nil {
		return 0
	}
	return c.opt.Cost(e.Value)
}

func (c *Cache[K, V]) pushFront(e *Entry[K, V]) {
	e.prev, e.next = &c.root, c.root.next
	c.root.next.prev = e
	c.root.next = e
}

func (c *Cache[K, V]) unlink(e *Entry[K, V]) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}
