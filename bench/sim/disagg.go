package sim

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A disaggregated fleet's requests carry their engines' own wire fields
// (see Config.Role):
//
//   - vLLM: a request whose kv_transfer_params ask for do_remote_decode is
//     a prefill: the replica computes it (max_tokens 1, as the router
//     sends it) and answers kv_transfer_params naming itself and the
//     prompt's blocks. One asking for do_remote_prefill is a decode: its
//     prompt's KV is received (Config.TransferTokenMs) rather than
//     computed.
//   - SGLang: a request with a bootstrap_room goes to a prefill and a
//     decode replica at once. On a prefill replica it is computed with
//     one token and its room marked done; on a decode replica it waits
//     for its room's prefill, then receives the KV as above.

// Roles (Config.Role).
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// ParseSplit parses "P:D", a fleet of P prefill and D decode replicas,
// both at least 1.
func ParseSplit(s string) (prefill, decode int, err error) {
	ps, ds, ok := strings.Cut(strings.TrimSpace(s), ":")
	p, perr := strconv.Atoi(ps)
	d, derr := strconv.Atoi(ds)
	if !ok || perr != nil || derr != nil || p < 1 || d < 1 {
		return 0, 0, fmt.Errorf("split %q: want P:D, P prefill and D decode replicas, both at least 1", s)
	}
	return p, d, nil
}

// roomAnnounceWait is how long a decode replica waits for a bootstrap
// room's prefill to arrive before it takes the KV as sent: a prefill
// replica in another process announces nothing here.
const roomAnnounceWait = time.Second

// pairing reads the wire fields of a disaggregated request: it reports
// whether the replica hands the prompt's KV over (a prefill answer), marks
// q remote when the KV comes from elsewhere, waiting for an SGLang room's
// prefill first, and returns the room a prefill replica finishes, if any.
func (r *Replica) pairing(ctx context.Context, in *apiRequest, q *request) (handoff bool, room *room) {
	switch {
	case in.KVTransfer != nil && in.KVTransfer.DoRemoteDecode:
		return true, nil
	case in.KVTransfer != nil && in.KVTransfer.DoRemotePrefill:
		q.remote = true
	case in.BootstrapRoom != nil && r.cfg.Role == RolePrefill:
		q.maxTokens, q.target = 1, 1
		rm := rooms.get(*in.BootstrapRoom)
		rm.announce()
		return false, rm
	case in.BootstrapRoom != nil && r.cfg.Role == RoleDecode:
		q.remote = true
		rooms.get(*in.BootstrapRoom).await(ctx)
		rooms.drop(*in.BootstrapRoom)
	}
	return false, nil
}

// transferParams is a vLLM prefill answer's kv_transfer_params: the
// engine and the block ids a decode replica pulls.
func transferParams(engine string, blocks int) []byte {
	b := []byte(`{"do_remote_prefill":true,"do_remote_decode":false,"remote_engine_id":`)
	b = strconv.AppendQuote(b, engine)
	b = append(b, `,"remote_block_ids":[`...)
	for i := range blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(i), 10)
	}
	return append(b, `],"remote_host":"127.0.0.1","remote_port":0,"tp_size":1}`...)
}

// room is an SGLang bootstrap room: announced when its prefill arrives,
// done when the prefill ends.
type room struct {
	at                     time.Time
	announced, done        chan struct{}
	announceOnce, doneOnce sync.Once
}

func (rm *room) announce() { rm.announceOnce.Do(func() { close(rm.announced) }) }
func (rm *room) finish()   { rm.doneOnce.Do(func() { close(rm.done) }) }

// await waits for the room's prefill to end: at most roomAnnounceWait for
// it to arrive, then until it ends or ctx does.
func (rm *room) await(ctx context.Context) {
	t := time.NewTimer(roomAnnounceWait)
	defer t.Stop()
	select {
	case <-rm.announced:
	case <-t.C:
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-rm.done:
	case <-ctx.Done():
	}
}

// roomBook holds the rooms of the replicas of this process. A room whose
// decode never came is dropped after roomTTL, when the next room is made.
type roomBook struct {
	mu sync.Mutex
	m  map[uint64]*room
}

const (
	roomTTL     = time.Minute
	roomPruneAt = 1024 // rooms held before old ones are looked for
)

var rooms = roomBook{m: map[uint64]*room{}}

func (b *roomBook) get(id uint64) *room {
	b.mu.Lock()
	defer b.mu.Unlock()
	if rm, ok := b.m[id]; ok {
		return rm
	}
	now := time.Now()
	if len(b.m) >= roomPruneAt {
		for k, rm := range b.m {
			if now.Sub(rm.at) > roomTTL {
				delete(b.m, k)
			}
		}
	}
	rm := &room{at: now, announced: make(chan struct{}), done: make(chan struct{})}
	b.m[id] = rm
	return rm
}

func (b *roomBook) drop(id uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, id)
}
