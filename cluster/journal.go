package cluster

import "sync"

// journal keeps this instance's own recent records that a peer needs to
// rebuild its view of this instance's share: placements, session bindings
// and stored response ids (not lifecycle or load, which the next load
// record supersedes). Each record is encoded with base time 0, as in the
// live batches, so that any run of them makes a batch of base 0. It holds at most max bytes, the
// oldest out first.
type journal struct {
	mu    sync.Mutex
	max   int64
	bytes int64
	ents  []jent // oldest first, from head
	head  int
}

type jent struct {
	at  int64  // Unix microseconds
	seq uint64 // the sequence of the live batch that carried it
	b   []byte
}

// add appends one encoded record of time at, sent in live batch seq.
func (j *journal) add(at int64, seq uint64, b []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.ents = append(j.ents, jent{at: at, seq: seq, b: b})
	j.bytes += int64(len(b))
	for j.bytes > j.max && j.head < len(j.ents) {
		j.bytes -= int64(len(j.ents[j.head].b))
		j.ents[j.head] = jent{}
		j.head++
	}
	// Compact once the dropped front outweighs what is kept.
	if j.head > 64 && j.head > len(j.ents)/2 {
		n := copy(j.ents, j.ents[j.head:])
		clear(j.ents[n:])
		j.ents, j.head = j.ents[:n], 0
	}
}

// chunks returns the records of time notBefore or later sent in a batch
// of ranges (in order), concatenated in order into chunks of about size bytes
// (a record larger than size makes a chunk of its own).
func (j *journal) chunks(notBefore int64, ranges []seqRange, size int) [][]byte {
	j.mu.Lock()
	defer j.mu.Unlock()
	var out [][]byte
	var cur []byte
	ri := 0
	for _, e := range j.ents[j.head:] {
		// Entries are in batch order: the ranges are passed once.
		for ri < len(ranges) && e.seq >= ranges[ri].until {
			ri++
		}
		if ri == len(ranges) {
			break
		}
		if e.at < notBefore || !ranges[ri].holds(e.seq) {
			continue
		}
		if len(cur) > 0 && len(cur)+len(e.b) > size {
			out = append(out, cur)
			cur = nil
		}
		cur = append(cur, e.b...)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// size returns the bytes held.
func (j *journal) size() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.bytes
}
