package oracle

import "container/list"

// lru is one replica's prefix cache: blocks by key, each of a size in
// tokens, evicted least recently used first while the cache holds more
// than its capacity.
type lru struct {
	capacity int64 // tokens; negative never evicts
	used     int64
	byKey    map[uint64]*list.Element
	// order holds the blocks (*entry), least recently used at the front.
	order list.List
}

type entry struct {
	key    uint64
	tokens int64
}

func newLRU(capacity int64) *lru {
	return &lru{capacity: capacity, byKey: make(map[uint64]*list.Element)}
}

// leading is the number of leading keys held.
func (c *lru) leading(keys []uint64) int {
	n := 0
	for n < len(keys) {
		if _, ok := c.byKey[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// touch makes every key, each a block of tokens tokens, the most recently
// used, the last key first (so the first ends most recent), adding those
// not held, then evicts down to the capacity.
func (c *lru) touch(keys []uint64, tokens int64) {
	for i := len(keys) - 1; i >= 0; i-- {
		if e := c.byKey[keys[i]]; e != nil {
			c.order.MoveToBack(e)
			continue
		}
		c.byKey[keys[i]] = c.order.PushBack(&entry{key: keys[i], tokens: tokens})
		c.used += tokens
	}
	for c.capacity >= 0 && c.used > c.capacity && c.order.Len() > 0 {
		e := c.order.Remove(c.order.Front()).(*entry)
		delete(c.byKey, e.key)
		c.used -= e.tokens
	}
}
