package cluster

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/config"
)

// Forger writes the messages a member of a cluster (one that holds its
// credential) could send, true or not: the attack bench's hostile member
// (bench/attack). Not safe for concurrent use.
type Forger struct {
	seal   *sealer
	prefix string
	epoch  uint64
	seq    map[string]uint64
}

// NewForger returns a Forger for the cluster c (its name and credential).
func NewForger(c config.Cluster) (*Forger, error) {
	k, err := deriveKeys(c)
	if err != nil {
		return nil, err
	}
	return &Forger{seal: newSealer(k.message), prefix: "kvroute." + c.Name, epoch: 1, seq: map[string]uint64{}}, nil
}

// Subject is where sender's live batches go.
func (f *Forger) Subject(sender string) string { return f.prefix + ".d." + sender }

// LeadSubject is where the asks to sender as the leader go.
func (f *Forger) LeadSubject(sender string) string { return f.prefix + ".lead." + sender }

// batch seals sender's next live batch of recs.
func (f *Forger) batch(sender string, recs []record) []byte {
	f.seq[sender]++
	b := appendHeader(nil, header{sender: sender, epoch: f.epoch, seq: f.seq[sender]})
	for i := range recs {
		b = appendRecord(b, &recs[i], 0)
	}
	return f.seal.seal(b)
}

// Load is sender's next batch claiming inflight requests and pending
// prefill tokens on replica.
func (f *Forger) Load(sender, replica string, inflight, pending uint64) []byte {
	return f.batch(sender, []record{{kind: recLoad, replica: replica, inflight: inflight, pending: pending}})
}

// Places is sender's next batch of n placements on replica, each of a
// random key of keyLen values, numbered from first.
func (f *Forger) Places(sender, replica string, first uint64, n, keyLen int, rng *rand.Rand) []byte {
	now := time.Now().UnixMicro()
	recs := make([]record, n)
	for i := range recs {
		key := make([]uint32, keyLen)
		for j := range key {
			key[j] = rng.Uint32()
		}
		recs[i] = record{kind: recPlace, id: first + uint64(i), at: now, replica: replica, model: "m", uncached: 16, key: key}
	}
	return f.batch(sender, recs)
}

// Answer is a leader's answer naming replica to an ask (the ask's bytes
// as received): "" when the ask does not open.
func (f *Forger) Answer(askMsg []byte, replica string) []byte {
	body, err := f.seal.open(askMsg, leadMagic1, leadVersion)
	if err != nil {
		return nil
	}
	a, err := decodeAsk(body)
	if err != nil {
		return nil
	}
	return f.seal.seal(encodeAnswer(a.ticket, replica))
}

// UnsealedLoad is Load with no valid MAC: what a non-member sends.
func (f *Forger) UnsealedLoad(sender, replica string, inflight uint64) []byte {
	b := f.Load(sender, replica, inflight, 0)
	clear(b[3 : 3+macLen])
	return b
}
