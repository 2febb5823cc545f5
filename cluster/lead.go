package cluster

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/router"
)

// The leader. Instances deciding in the same millisecond do not see each
// other's placements until a batch later, so requests placed on load
// (cold, or a new branch of a shared prefix: the replica is chosen by its
// queue and prefill work, not by what it holds) would land on whichever
// replica each believes least loaded, the same one. The live instance of
// the lowest id leads: the others ask it, with a deadline
// (cluster.lead_timeout), to choose such a request's replica. It chooses
// as the one router of the cluster and reserves the choice in its own view
// (Index entry, pending prefill, one request in flight) under the ask's
// ticket, until the asking instance's placement, which names the ticket,
// replaces it, its cancel (an answer that came too late) takes it back, or
// reserveLife passes. Past the deadline, or without a leader, an
// instance chooses on its own view.
//
// Asks and answers (version 1; integers are unsigned varints, a string is
// its length then its bytes):
//
//	ask    := 'k' 'l' version:u8 mac:[16] ticket model:string tokens nkey key:u32le*nkey
//	answer := 'k' 'l' version:u8 mac:[16] ticket replica:string
//
// Both are sealed (auth.go): an ask a member did not seal is not answered.
//
// The asking instance numbers its tickets from a random start (never 0);
// the answer repeats the ticket. An answer naming no replica says the leader had none for
// the model.
const (
	leadMagic1  = 'l'
	leadVersion = 2
)

// reserveLife is how long a reservation waits for the placement that names
// it: the asking instance's next batch, or its peers' lag past it.
const reserveLife = time.Second

// leadDownFor is how long an instance chooses alone after its leader could
// not be reached at all (no responders, connection closed): its peers see
// it gone within three load intervals.
const leadDownFor = time.Second

// encodeAsk and encodeAnswer leave the MAC for sealer.seal.
func encodeAsk(a ask) []byte {
	b := start(nil, leadMagic1, leadVersion)
	b = binary.AppendUvarint(b, a.ticket)
	b = appendString(b, a.model)
	b = binary.AppendUvarint(b, uint64(max(a.tokens, 0)))
	return appendKey(b, a.key)
}

func encodeAnswer(ticket uint64, replica string) []byte {
	b := start(nil, leadMagic1, leadVersion)
	b = binary.AppendUvarint(b, ticket)
	return appendString(b, replica)
}

// end fails the reader if bytes are left: an ask or answer is one message.
func (r *reader) end() {
	if r.err == nil && len(r.b) > 0 {
		r.fail(errors.New("trailing bytes"))
	}
}

// maxAskTokens bounds an ask's prompt tokens.
const maxAskTokens = 1 << 40

type ask struct {
	ticket uint64
	model  string
	tokens int
	key    []uint32
}

// decodeAsk and decodeAnswer read an opened ask or answer, b what follows
// its MAC.
func decodeAsk(b []byte) (ask, error) {
	r := reader{b: b}
	var a ask
	a.ticket = r.uvarint()
	a.model = r.string()
	a.tokens = int(min(r.uvarint(), maxAskTokens)) //nolint:gosec // bounded above
	a.key = r.key()
	r.end()
	if r.err == nil && a.ticket == 0 {
		r.fail(errors.New("ask without a ticket"))
	}
	return a, r.err
}

func decodeAnswer(b []byte) (ticket uint64, replica string, err error) {
	r := reader{b: b}
	ticket = r.uvarint()
	replica = r.string()
	r.end()
	return ticket, replica, r.err
}

// newTicket returns a ticket no other ask of this instance had, and
// unlikely to be another instance's: a random start, counted up; never 0.
func (n *Node) newTicket() uint64 {
	for {
		if t := n.ticketBase + n.tickets.Add(1); t != 0 {
			return t
		}
	}
}

// reservation is a choice this instance made as the leader, waiting for
// the asking instance's placement.
type reservation struct {
	res  *router.Reservation
	name string
	at   time.Time
}

var _ router.Coordinator = (*Node)(nil)

// Coordinate implements router.Coordinator: Self when this instance leads,
// the leader's answer within cluster.lead_timeout otherwise, or no choice.
func (n *Node) Coordinate(model string, key []uint32, tokens int) router.Lead {
	lp := n.leader.Load()
	if lp == nil {
		return router.Lead{}
	}
	if *lp == n.id {
		return router.Lead{Self: true}
	}
	wait := n.opts.Config.LeadTimeout
	if wait <= 0 || n.nc == nil || time.Now().UnixNano() < n.leadDown.Load() {
		n.stats.leadAlone.Add(1)
		return router.Lead{}
	}
	n.stats.leadAsked.Add(1)
	a := ask{ticket: n.newTicket(), model: model, tokens: tokens, key: key}
	start := time.Now()
	m, err := n.nc.Request(n.subj.leadOf(*lp), n.seal.seal(encodeAsk(a)), wait)
	n.stats.leadWait.record(time.Since(start))
	if err != nil {
		n.stats.leadMissed.Add(1)
		if !errors.Is(err, nats.ErrTimeout) {
			n.leadDown.Store(time.Now().Add(leadDownFor).UnixNano())
		}
		// The leader may still answer, and reserve: take it back.
		n.add(&record{kind: recCancel, ticket: a.ticket}, false)
		return router.Lead{}
	}
	body, err := n.seal.open(m.Data, leadMagic1, leadVersion)
	var ticket uint64
	var replica string
	if err == nil {
		ticket, replica, err = decodeAnswer(body)
	}
	if err != nil || ticket != a.ticket {
		n.reject(err, "lead answer")
		n.add(&record{kind: recCancel, ticket: a.ticket}, false)
		return router.Lead{}
	}
	return router.Lead{Replica: replica, Ticket: ticket}
}

// answer serves a peer's ask: choose, reserve, reply with the ticket.
func (n *Node) answer(m *nats.Msg) {
	body, err := n.seal.open(m.Data, leadMagic1, leadVersion)
	var a ask
	if err == nil {
		a, err = decodeAsk(body)
	}
	if err != nil {
		n.reject(err, "lead ask")
		return // the asker's deadline passes
	}
	var name string
	if res, err := n.opts.Router.Reserve(a.model, a.key, a.tokens); err == nil {
		name = res.Replica.Name()
		n.inMu.Lock()
		if _, gone := n.canceled[a.ticket]; gone {
			// The asker gave up, and its cancel came first (asks and
			// batches arrive on subscriptions of their own).
			delete(n.canceled, a.ticket)
			n.inMu.Unlock()
			res.Release()
		} else {
			if old := n.reserved[a.ticket]; old != nil {
				n.releaseLocked(a.ticket, nil) // asked twice: the later counts
			}
			n.reserved[a.ticket] = &reservation{res: res, name: name, at: time.Now()}
			n.reservedOn[name]++
			n.totalLocked(name, res.Replica)
			n.inMu.Unlock()
		}
	}
	n.stats.leadServed.Add(1)
	if err := m.Respond(n.seal.seal(encodeAnswer(a.ticket, name))); err != nil {
		n.stats.dropped.Add(1)
	}
}

// releaseLocked takes back reservation ticket, if this instance holds it.
func (n *Node) releaseLocked(ticket uint64, reps map[string]*backends.Replica) bool {
	r := n.reserved[ticket]
	if r == nil {
		return false
	}
	delete(n.reserved, ticket)
	n.reservedOn[r.name]--
	if n.reservedOn[r.name] <= 0 {
		delete(n.reservedOn, r.name)
	}
	r.res.Release()
	if _, ok := reps[r.name]; ok {
		n.touched[r.name] = struct{}{}
	}
	return true
}

// lapseLocked releases the reservations older than reserveLife.
func (n *Node) lapseLocked(now time.Time, reps map[string]*backends.Replica) {
	for t, r := range n.reserved {
		if now.Sub(r.at) > reserveLife && n.releaseLocked(t, reps) {
			n.stats.leadLapsed.Add(1)
		}
	}
	for t, at := range n.canceled {
		if now.Sub(at) > reserveLife {
			delete(n.canceled, t)
		}
	}
}

// cancelLocked takes back reservation ticket, or, when it is not made yet
// (or is another leader's), remembers the cancel for reserveLife.
func (n *Node) cancelLocked(ticket uint64, reps map[string]*backends.Replica, now time.Time) {
	if !n.releaseLocked(ticket, reps) {
		n.canceled[ticket] = now
	}
}

// noteLeaderLocked sets the leader: the lowest id of this instance and its
// live peers, none without live peers.
func (n *Node) noteLeaderLocked() {
	lead := n.id
	live := false
	for id, p := range n.peers {
		if !p.gone {
			live = true
			lead = min(lead, id)
		}
	}
	if !live {
		n.leader.Store(nil)
		return
	}
	if old := n.leader.Load(); old == nil || *old != lead {
		n.leader.Store(&lead)
	}
}
