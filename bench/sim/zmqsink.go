package sim

import (
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/kvevents"
)

// zmqSink publishes a replica's batches through a kvevents.Publisher bound
// on 127.0.0.1, as vLLM's ZMQ event publisher does.
type zmqSink struct {
	pub  *kvevents.Publisher
	opts kvevents.PubOptions
	bs   int
	rank int // the batches' dp_rank
}

// newZMQSink binds the event publisher of the replica c configures: PUB on
// c.KVEventsPort, replay on c.KVEventsReplayPort (none when negative).
func newZMQSink(c *Config) (batchSink, error) {
	enc := kvevents.Positional
	if c.KVEventsEncoding == "tagged" {
		enc = kvevents.Tagged
	}
	replay := ""
	if c.KVEventsReplayPort >= 0 {
		replay = "tcp://127.0.0.1:" + strconv.Itoa(c.KVEventsReplayPort)
	}
	s := &zmqSink{bs: c.BlockSize, rank: c.DataParallelRank, opts: kvevents.PubOptions{
		Endpoint:       "tcp://127.0.0.1:" + strconv.Itoa(c.KVEventsPort),
		ReplayEndpoint: replay,
		Topic:          c.KVEventsTopic,
		Encoding:       enc,
		Keep:           c.KVEventsKeep,
	}}
	pub, err := kvevents.NewPublisher(s.opts)
	if err != nil {
		return nil, fmt.Errorf("sim: %s: %w", c.Name, err)
	}
	// The ports bound, for a restart to bind the same ones.
	s.pub, s.opts.Endpoint, s.opts.ReplayEndpoint = pub, pub.Addr(), pub.ReplayAddr()
	return s, nil
}

// restart is called with no publish in flight (eventStream.mu held).
func (s *zmqSink) restart() error {
	_ = s.pub.Close()
	pub, err := kvevents.NewPublisher(s.opts)
	if err != nil {
		return err
	}
	s.pub = pub
	return nil
}

func (s *zmqSink) publish(ts float64, evs []cacheEvent, dropped bool) error {
	b := kvevents.Batch{TS: ts, DPRank: s.rank, Events: make([]kvevents.Event, len(evs))}
	for i := range evs {
		b.Events[i] = evs[i].wire(s.bs)
	}
	if dropped {
		return s.pub.Withhold(b)
	}
	return s.pub.Publish(b)
}

func (s *zmqSink) endpoints() (string, string) { return s.opts.Endpoint, s.opts.ReplayEndpoint }

func (s *zmqSink) close() error { return s.pub.Close() }

// wire is e as a kvevents event of a replica with blocks of bs tokens (one
// full-attention cache group, index 0).
func (e *cacheEvent) wire(bs int) kvevents.Event {
	switch e.kind {
	case blockStored:
		return kvevents.BlockStored{
			BlockHashes: e.keys,
			ParentHash:  e.parent,
			HasParent:   e.hasParent,
			TokenIDs:    e.tokens,
			BlockSize:   bs,
			Medium:      e.medium,
		}
	case blockRemoved:
		return kvevents.BlockRemoved{BlockHashes: e.keys, Medium: e.medium}
	default:
		return kvevents.AllBlocksCleared{}
	}
}
