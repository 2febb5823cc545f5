package sim

// hostTier is the second KV tier in host (CPU) memory, modelling vLLM's CPU
// offloading connector, LMCache or SGLang HiCache: an LRU set of at most cap
// block keys. It holds keys only; a hit has to be loaded into freshly
// allocated GPU blocks before use (see Replica.schedule).
//
// It is write-through: every full prompt block registered in the GPU cache
// also stores its key here, so a block evicted from the GPU cache can still
// be loaded from host memory while its key survives here. Storing a key
// already held, or touching it on a hit, makes it the most recently used.
//
// Entries live in an arena (ents) linked by index into a doubly linked LRU
// list: head is the least recently used key, evicted first when a new key
// is stored into a full tier. The arena grows up to cap entries; an
// eviction reuses the evicted entry's slot.
type hostTier struct {
	cap        int
	idx        map[uint64]int // key -> index into ents
	ents       []hostEntry
	head, tail int // -1 when empty
	// log, when not nil, records every eviction.
	log *eventLog
}

type hostEntry struct {
	key        uint64
	prev, next int // -1 at the ends
}

// newHostTier returns a tier of capacity blocks, or nil (no host tier) when
// capacity is not positive.
func newHostTier(capacity int) *hostTier {
	if capacity <= 0 {
		return nil
	}
	return &hostTier{cap: capacity, idx: make(map[uint64]int), head: -1, tail: -1}
}

// len is the number of keys held.
func (h *hostTier) len() int { return len(h.idx) }

// contains reports whether key is held, without refreshing it.
func (h *hostTier) contains(key uint64) bool {
	_, ok := h.idx[key]
	return ok
}

// run returns the length of the unbroken leading run of keys held, without
// refreshing them.
func (h *hostTier) run(keys []uint64) int {
	for i, k := range keys {
		if _, ok := h.idx[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// touch makes key the most recently used if it is held (a hit).
func (h *hostTier) touch(key uint64) {
	if i, ok := h.idx[key]; ok {
		h.unlink(i)
		h.pushTail(i)
	}
}

// store adds key as the most recently used, evicting the least recently
// used key if the tier is full. A key already held is only refreshed.
func (h *hostTier) store(key uint64) {
	if _, ok := h.idx[key]; ok {
		h.touch(key)
		return
	}
	var i int
	if len(h.idx) >= h.cap {
		i = h.head
		h.unlink(i)
		delete(h.idx, h.ents[i].key)
		if h.log != nil {
			h.log.removed(mediumCPU, h.ents[i].key)
		}
	} else {
		i = len(h.ents)
		h.ents = append(h.ents, hostEntry{})
	}
	h.ents[i].key = key
	h.idx[key] = i
	h.pushTail(i)
}

// reset drops every key.
func (h *hostTier) reset() {
	clear(h.idx)
	h.ents = h.ents[:0]
	h.head, h.tail = -1, -1
}

func (h *hostTier) unlink(i int) {
	e := &h.ents[i]
	if e.prev >= 0 {
		h.ents[e.prev].next = e.next
	} else {
		h.head = e.next
	}
	if e.next >= 0 {
		h.ents[e.next].prev = e.prev
	} else {
		h.tail = e.prev
	}
	e.prev, e.next = -1, -1
}

func (h *hostTier) pushTail(i int) {
	e := &h.ents[i]
	e.prev, e.next = h.tail, -1
	if h.tail >= 0 {
		h.ents[h.tail].next = i
	} else {
		h.head = i
	}
	h.tail = i
}
