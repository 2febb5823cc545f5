package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// PubOptions configure a Publisher.
type PubOptions struct {
	// Endpoint is where the PUB socket binds, as vLLM's endpoint option
	// spells it: "tcp://*:5557", or "tcp://127.0.0.1:0" for any free port
	// (Addr tells which).
	Endpoint string
	// Connect makes the PUB socket dial Endpoint, a subscriber's listening
	// address, instead of binding it (as vLLM does when its endpoint names
	// a host).
	Connect bool
	// ReplayEndpoint is where the ROUTER replay socket binds; "" for none.
	ReplayEndpoint string
	// Topic is the first frame of every message ("" like vLLM's default).
	Topic    string
	Encoding Encoding
	// Keep is how many of the latest batches the replay socket can serve
	// (vLLM keeps 10,000); 0 means 10,000.
	Keep int
}

// Publisher publishes batches the way an engine does: each message is
// [topic, 8-byte big-endian sequence, payload], sequences counting from 0,
// and the replay socket answers a start sequence with every kept batch from
// there, then the sequence -1. It is safe for concurrent use.
type Publisher struct {
	opts   PubOptions
	cancel context.CancelFunc
	pub    zmq4.Socket
	replay zmq4.Socket // nil without a replay endpoint
	done   chan struct{}

	mu     sync.Mutex
	next   int64  // sequence of the next batch
	ring   []kept // the last Keep batches, oldest at ring[head] once full
	head   int
	closed bool
}

type kept struct {
	seq     int64
	payload []byte
}

// endSeq is the sequence of the replay's last message: -1, all ones.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// quietLog drops zmq4's own log lines; its errors come back through calls.
var quietLog = log.New(io.Discard, "", 0)

// NewPublisher binds the sockets o names.
func NewPublisher(o PubOptions) (*Publisher, error) {
	if o.Endpoint == "" {
		return nil, errors.New("kvevents: a publisher needs an endpoint")
	}
	if o.Keep <= 0 {
		o.Keep = 10_000
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{opts: o, cancel: cancel, done: make(chan struct{})}
	p.pub = zmq4.NewPub(ctx, zmq4.WithLogger(quietLog))
	open := p.pub.Listen
	if o.Connect {
		open = p.pub.Dial
	}
	if err := open(o.Endpoint); err != nil {
		cancel()
		_ = p.pub.Close()
		return nil, fmt.Errorf("kvevents: publish on %s: %w", o.Endpoint, err)
	}
	if o.ReplayEndpoint == "" {
		close(p.done)
		return p, nil
	}
	p.replay = zmq4.NewRouter(ctx, zmq4.WithLogger(quietLog))
	if err := p.replay.Listen(o.ReplayEndpoint); err != nil {
		cancel()
		_ = p.pub.Close()
		_ = p.replay.Close()
		return nil, fmt.Errorf("kvevents: replay on %s: %w", o.ReplayEndpoint, err)
	}
	go p.serveReplay()
	return p, nil
}

// Addr is the PUB socket's bound address, as a subscriber dials it.
func (p *Publisher) Addr() string { return tcpAddr(p.pub) }

// ReplayAddr is the replay socket's bound address; "" without one.
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return tcpAddr(p.replay)
}

func tcpAddr(s zmq4.Socket) string {
	if a := s.Addr(); a != nil {
		return "tcp://" + a.String()
	}
	return ""
}

// Publish sends b under the next sequence and keeps it for replay.
func (p *Publisher) Publish(b Batch) error { return p.publish(b, true) }

// Withhold keeps b for replay under the next sequence without sending it,
// as if every subscriber had missed that message: the next Publish shows
// them a gap that only a replay fills.
func (p *Publisher) Withhold(b Batch) error { return p.publish(b, false) }

func (p *Publisher) publish(b Batch, send bool) error {
	payload, err := Encode(b, p.opts.Encoding)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("kvevents: publisher closed")
	}
	seq := p.next
	p.next++
	k := kept{seq: seq, payload: payload}
	if len(p.ring) < p.opts.Keep {
		p.ring = append(p.ring, k)
	} else {
		p.ring[p.head] = k
		p.head = (p.head + 1) % len(p.ring)
	}
	if !send {
		return nil
	}
	// Sent under the lock, so that sequences leave in order.
	return p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.opts.Topic), seqBytes(seq), payload))
}

func seqBytes(seq int64) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(seq)) //nolint:gosec // the wire carries the bits
}

// since copies the kept batches from sequence start on, oldest first.
func (p *Publisher) since(start int64) []kept {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []kept
	for i := range p.ring {
		k := p.ring[(p.head+i)%len(p.ring)]
		if k.seq >= start {
			out = append(out, k)
		}
	}
	return out
}

// serveReplay answers replay requests until the publisher closes. A request
// is [identity, start] from a DEALER, or [identity, "", start] from a REQ
// socket or a DEALER that adds the delimiter (vLLM's ROUTER requires it);
// every reply is [identity, "", sequence, payload].
func (p *Publisher) serveReplay() {
	defer close(p.done)
	for {
		msg, err := p.replay.Recv()
		if err != nil {
			return // the socket closed
		}
		f := msg.Frames
		if len(f) == 3 && len(f[1]) == 0 {
			f = [][]byte{f[0], f[2]}
		}
		if len(f) != 2 || len(f[1]) != 8 {
			continue
		}
		id := f[0]
		start := int64(binary.BigEndian.Uint64(f[1])) //nolint:gosec // the wire carries the bits
		for _, k := range p.since(start) {
			if err := p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, seqBytes(k.seq), k.payload)); err != nil {
				break
			}
		}
		_ = p.replay.SendMulti(zmq4.NewMsgFrom(id, nil, endSeq, nil))
	}
}

// Close unbinds the sockets; later Publish calls fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	was := p.closed
	p.closed = true
	p.mu.Unlock()
	if was {
		return nil
	}
	p.cancel()
	err := p.pub.Close()
	if p.replay != nil {
		if e := p.replay.Close(); err == nil {
			err = e
		}
	}
	<-p.done
	return err
}
