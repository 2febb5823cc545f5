package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"go.uber.org/zap"

	"github.com/kvroute/kvroute/lograte"
)

// Handler receives one publisher's batches, in sequence order, from one
// goroutine at a time.
type Handler interface {
	// Apply is called for every batch, live or replayed, once.
	Apply(Batch)
	// Reset says batches were lost that no replay can give back (or the
	// engine restarted): the state built from earlier batches no longer
	// matches the engine's and should be dropped. Batches after it are
	// still delivered.
	Reset(reason string)
}

// SubOptions configure Subscribe.
type SubOptions struct {
	// Endpoint is the engine's PUB socket, e.g. "tcp://10.0.0.5:5557"
	// (vLLM's data-parallel rank r publishes on the port + r: one
	// subscription per rank); with Bind, the address the subscriber
	// listens on, e.g. "tcp://0.0.0.0:5557", for the engine to dial.
	Endpoint string
	// Bind makes the subscriber listen on Endpoint for the engine's
	// publisher to connect (vLLM connects when its endpoint names a host,
	// llm-d-inference-sim always) instead of dialing it. See listen.go for
	// how connections are admitted.
	Bind bool
	// AllowPeer, with Bind, admits a connection by its peer's address;
	// nil admits every address.
	AllowPeer func(netip.Addr) bool
	// HandshakeTimeout, with Bind, bounds the time from a connection's
	// accept to the end of its ZMTP handshake; 0 means
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// ReplayEndpoint is the engine's ROUTER replay socket; "" when the
	// engine has none, in which case every gap is a Reset.
	ReplayEndpoint string
	// Topic filters messages by prefix, as ZMQ does ("" for all).
	Topic   string
	Handler Handler
	Logger  *zap.Logger // nil for none
	// ReplayTimeout bounds one replay, from dialing to the end marker;
	// 0 means 5 s.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before reconnecting, which
	// doubles while connections fail; 0 means 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// MaxEventBytes bounds, in bytes, a frame and a whole message, on the
	// PUB and the replay socket alike: a header declaring more closes the
	// connection before anything of that size is allocated (counted in
	// Status.Rejected), and the subscription is not Live again until a
	// batch is delivered on a new connection. Decoding a batch may
	// allocate up to DecodeFactor times it. 0 means DefaultMaxEventBytes.
	MaxEventBytes int64
}

// DecodeFactor is a batch's decoding budget as a multiple of
// SubOptions.MaxEventBytes (see DecodeWithin).
const DecodeFactor = 4

// Status is a snapshot of a subscription.
type Status struct {
	// Live is whether the subscriber is connected to the publisher now.
	Live bool
	// Listening is whether a subscriber with SubOptions.Bind is listening
	// now (with Live false: for the publisher to connect).
	Listening bool
	// LastMessage is when the last live message arrived (zero before one).
	LastMessage time.Time
	// Seq is the sequence of the last batch delivered, -1 before any.
	Seq int64
	// LastLag is how far behind its batch's timestamp the last batch was
	// delivered.
	LastLag time.Duration
	// Batches and Events count what was delivered to Apply; Skipped the
	// events of unknown types left out of them.
	Batches, Events, Skipped uint64
	// Gaps counts sequence gaps in the live stream, Restarts the times the
	// sequence went back (an engine restart), Replays the replays asked
	// for, Resets the calls to Handler.Reset, DecodeErrors the messages
	// or payloads that could not be read, Connects the connections made.
	Gaps, Restarts, Replays, Resets, DecodeErrors, Connects uint64
	// Rejected counts, by reason, the connections closed for what their
	// peer sent (a frame or message over SubOptions.MaxEventBytes, bytes
	// that are not ZMTP) and the messages left out (malformed ones,
	// payloads that are not a batch or decode past their budget).
	Rejected Rejects
}

// Subscriber follows one publisher; see Subscribe.
type Subscriber struct {
	o    SubOptions
	log  *zap.Logger
	warn *lograte.Limiter // every line a peer can cause at will
	done chan struct{}

	// Read by Status from any goroutine.
	live                                          atomic.Bool
	lastMsg, lastLag, seq                         atomic.Int64
	batches, events, skipped                      atomic.Uint64
	gaps, restarts, replays, resets, decodeErrors atomic.Uint64
	connects                                      atomic.Uint64
	rejected                                      [numRejects]atomic.Uint64
	// suspect is set when a connection was rejected: Live waits for a
	// batch delivered on a new one.
	suspect atomic.Bool
	// listening: a Bind subscriber's socket is open; newPeer: a publisher
	// connected to it, whose first message starts a new connection's
	// sequence (set by the accepting goroutine, taken by run's).
	listening, newPeer atomic.Bool

	// Owned by the run goroutine.
	next     int64  // sequence of the next batch to deliver
	lastSum  uint64 // the digest of batch next-1's payload, when havePrev
	havePrev bool
	seed     maphash.Seed
	lastLive int64 // the last live sequence on this connection, -1 before one
}

// Subscribe starts following the publisher o names and returns at once; the
// subscription runs until ctx ends (Done then closes). It connects to
// Endpoint's PUB socket, subscribed to Topic, and delivers every batch to
// o.Handler in sequence order. When the sequence skips ahead, goes back (the
// engine restarted) or starts past 0 on a new subscription, it asks
// ReplayEndpoint for the missing batches and delivers them first; when they
// cannot all be had (no replay endpoint, the replay no longer keeps them, it
// failed) it calls Reset and goes on from what it has. A lost connection is
// retried with backoff; the next message then shows whether anything was
// missed.
func Subscribe(ctx context.Context, o SubOptions) (*Subscriber, error) {
	s, err := newSubscriber(o)
	if err != nil {
		return nil, err
	}
	go s.run(ctx)
	return s, nil
}

// newSubscriber checks o and fills in its defaults.
func newSubscriber(o SubOptions) (*Subscriber, error) {
	if o.Endpoint == "" {
		return nil, errors.New("kvevents: a subscription needs an endpoint")
	}
	if o.Handler == nil {
		return nil, errors.New("kvevents: a subscription needs a handler")
	}
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = 5 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.MaxEventBytes <= 0 {
		o.MaxEventBytes = DefaultMaxEventBytes
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	s := &Subscriber{o: o, log: o.Logger, done: make(chan struct{}), lastLive: -1, seed: maphash.MakeSeed()}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	s.log = s.log.With(zap.String("endpoint", o.Endpoint))
	s.warn = lograte.New(s.log, 0)
	s.seq.Store(-1)
	return s, nil
}

// Done is closed once the subscription has stopped and closed its sockets.
func (s *Subscriber) Done() <-chan struct{} { return s.done }

// Status reports the subscription's state and counters.
func (s *Subscriber) Status() Status {
	st := Status{
		Live: s.live.Load(), Listening: s.listening.Load(),
		Seq:     s.seq.Load(),
		LastLag: time.Duration(s.lastLag.Load()),
		Batches: s.batches.Load(), Events: s.events.Load(), Skipped: s.skipped.Load(),
		Gaps: s.gaps.Load(), Restarts: s.restarts.Load(), Replays: s.replays.Load(),
		Resets: s.resets.Load(), DecodeErrors: s.decodeErrors.Load(), Connects: s.connects.Load(),
	}
	if t := s.lastMsg.Load(); t != 0 {
		st.LastMessage = time.Unix(0, t)
	}
	for i := range st.Rejected {
		st.Rejected[i] = s.rejected[i].Load()
	}
	return st
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	wait := s.o.MinBackoff
	failing := false // say once that connecting fails, not at every try
	for {
		received, err := s.session(ctx)
		s.live.Store(false)
		if ctx.Err() != nil {
			return
		}
		if received {
			wait, failing = s.o.MinBackoff, false
		}
		if failing {
			s.log.Debug("kv events: still cannot connect", zap.Error(err), zap.Duration("retry_in", wait))
		} else {
			s.warn.Warn("connection", "kv events: connection lost or refused, reconnecting", zap.Error(err), zap.Duration("retry_in", wait))
		}
		failing = !received
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, s.o.MaxBackoff)
	}
}

// socketOptions make dials fail at once rather than retry inside zmq4:
// retries are run's, with its backoff and ctx.
func (s *Subscriber) socketOptions() []zmq4.Option {
	return []zmq4.Option{
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(s.o.ReplayTimeout),
		zmq4.WithLogger(quietLog),
	}
}

// guarded returns ctx carrying a new bound for the connections of a
// socket made with it (see guard.go), and a ctx that a rejection cancels.
// With bind, the socket listens and admits connections by s's options.
func (s *Subscriber) guarded(ctx context.Context, socket string, bind bool) (context.Context, *guard, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	g := newGuard(s.o.MaxEventBytes, func(r Reject) {
		s.rejected[r].Add(1)
		s.suspect.Store(true)
		s.live.Store(false)
		s.warn.Warn(r.String(), "kv events: connection closed: its peer sent what the bound refuses",
			zap.String("socket", socket), zap.Stringer("reason", r), zap.Int64("max_event_bytes", s.o.MaxEventBytes))
		cancel() // Recv returns, whatever zmq4 still queues
	})
	if bind {
		g.bind = &bindPolicy{
			allow:     s.o.AllowPeer,
			handshake: s.o.HandshakeTimeout,
			refuse: func(peer, why string) {
				s.rejected[PeerRefused].Add(1)
				s.warn.Warn("refused", "kv events: a connection to the listening socket was refused",
					zap.String("peer", peer), zap.String("why", why))
			},
			onPeer: func(up bool) {
				if up {
					s.connects.Add(1)
					s.newPeer.Store(true)
				}
				s.live.Store(up && !s.suspect.Load())
			},
		}
	}
	return withGuard(ctx, g), g, cancel
}

// session runs one connection until it fails or ctx ends, and reports
// whether any message arrived on it.
func (s *Subscriber) session(ctx context.Context) (received bool, err error) {
	ctx, g, cancel := s.guarded(ctx, "pub", s.o.Bind)
	defer cancel()
	defer g.shutdown()
	sub := zmq4.NewSub(ctx, s.socketOptions()...)
	defer func() { _ = sub.Close() }()
	if err := sub.SetOption(zmq4.OptionSubscribe, s.o.Topic); err != nil {
		return false, err
	}
	s.lastLive = -1
	if s.o.Bind {
		if err := sub.Listen(guarded(s.o.Endpoint)); err != nil {
			return false, err
		}
		s.listening.Store(true)
		defer s.listening.Store(false)
	} else {
		if err := sub.Dial(guarded(s.o.Endpoint)); err != nil {
			return false, err
		}
		s.connects.Add(1)
		s.live.Store(!s.suspect.Load())
	}
	for {
		msg, err := sub.Recv()
		if err != nil && s.o.Bind && ctx.Err() == nil {
			continue // one peer's connection ended; the socket listens on
		}
		if err != nil {
			return received, err
		}
		if ctx.Err() != nil { // rejected: what zmq4 read before is dropped
			return received, ctx.Err()
		}
		if s.newPeer.Swap(false) {
			s.lastLive = -1 // a new connection: see onMessage
		}
		received = true
		s.lastMsg.Store(time.Now().UnixNano())
		s.onMessage(ctx, msg.Frames)
		release(g, msg)
	}
}

// release gives the bytes of a message handled back to its guard.
func release(g *guard, msg zmq4.Msg) {
	if msg.Type == zmq4.CmdMsg {
		return // commands are not counted
	}
	var n int64
	for _, f := range msg.Frames {
		n += int64(len(f))
	}
	g.release(n)
}

// rejectMsg counts a message left out for reason r and says so, at most
// once per reason per 10 s.
func (s *Subscriber) rejectMsg(r Reject, msg string, fields ...zap.Field) {
	s.rejected[r].Add(1)
	s.warn.Warn(r.String(), msg, fields...)
}

// onMessage handles one live message [topic, sequence, payload].
func (s *Subscriber) onMessage(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.decodeErrors.Add(1)
		s.rejectMsg(Malformed, "kv events: malformed message", zap.Int("frames", len(frames)))
		return // its sequence is unknown: the next one shows the gap
	}
	seq := int64(binary.BigEndian.Uint64(frames[1])) //nolint:gosec // the wire carries the bits
	// The sequence went back on this connection, or a new connection
	// starts behind what was delivered: the engine restarted and counts
	// from 0 again.
	if (s.lastLive >= 0 && seq <= s.lastLive) || (s.lastLive < 0 && seq < s.next) {
		s.restarts.Add(1)
		s.reset(fmt.Sprintf("engine restarted: sequence %d after %d", seq, s.next-1))
		s.skipTo(0)
	}
	first := s.lastLive < 0
	s.lastLive = seq
	switch {
	case seq < s.next:
		return // delivered already, by a replay
	case seq > s.next:
		if s.next > 0 { // not the start of a first subscription or of a restart
			s.gaps.Add(1)
		}
		s.catchUp(ctx, seq)
	case first && s.next > 0 && s.o.ReplayEndpoint != "":
		// A new connection that goes on where the last one stopped may
		// still be to a restarted engine: catchUp checks.
		s.catchUp(ctx, seq)
	}
	s.deliver(seq, frames[2])
}

// catchUp delivers batches s.next up to (not including) upto from the
// replay socket, resetting for what it cannot get. When batches were
// delivered it asks from the one before s.next too: the same payload comes
// back from the same engine, a different one from a restarted engine that
// has already counted past s.next.
func (s *Subscriber) catchUp(ctx context.Context, upto int64) {
	if s.o.ReplayEndpoint == "" {
		if s.next > 0 || s.havePrev {
			s.reset(fmt.Sprintf("missed batches %d to %d and there is no replay endpoint", s.next, upto-1))
		}
		// Else the first batch of a first subscription (or after a
		// restart, reset already): nothing of this state was lost.
		s.skipTo(upto)
		return
	}
	verify := s.havePrev && s.next > 0
	from := s.next
	if verify {
		from--
	}
	restarted, err := s.replayFrom(ctx, from, upto, verify)
	if restarted {
		s.restarts.Add(1)
		s.reset(fmt.Sprintf("engine restarted: replayed batch %d differs from the one delivered", from))
		s.skipTo(0)
		_, err = s.replayFrom(ctx, 0, upto, false)
	}
	if err != nil {
		s.warn.Warn("replay", "kv events: replay failed", zap.String("replay", s.o.ReplayEndpoint), zap.Error(err))
	}
	if s.next < upto {
		s.reset(fmt.Sprintf("replay ended before batch %d, needed up to %d", s.next, upto-1))
		s.skipTo(upto)
	}
}

// replayFrom asks the replay socket for the batches from sequence from on
// and delivers those in [s.next, upto). With verify, batch from must be the
// one delivered last; restarted reports that it was not.
func (s *Subscriber) replayFrom(ctx context.Context, from, upto int64, verify bool) (restarted bool, err error) {
	s.replays.Add(1)
	ctx, cancel := context.WithTimeout(ctx, s.o.ReplayTimeout)
	defer cancel()
	ctx, g, cancelGuard := s.guarded(ctx, "replay", false)
	defer cancelGuard()
	defer g.shutdown()
	d := zmq4.NewDealer(ctx, s.socketOptions()...)
	defer func() { _ = d.Close() }()
	if err := d.Dial(guarded(s.o.ReplayEndpoint)); err != nil {
		return false, err
	}
	// The empty delimiter makes the request [identity, "", start] at the
	// engine's ROUTER, the form vLLM reads.
	if err := d.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(from))); err != nil {
		return false, err
	}
	for {
		msg, err := d.Recv()
		if err == nil {
			err = ctx.Err() // rejected: what zmq4 read before is dropped
		}
		if err != nil {
			return false, err
		}
		done, restarted, err := s.replayed(msg, from, upto, &verify)
		release(g, msg)
		if done || restarted || err != nil {
			return restarted, err
		}
	}
}

// replayed handles one message of a replay (see replayFrom): done at its
// end marker.
func (s *Subscriber) replayed(msg zmq4.Msg, from, upto int64, verify *bool) (done, restarted bool, err error) {
	f, ok := replayFrames(msg.Frames)
	if !ok {
		s.decodeErrors.Add(1)
		s.rejected[Malformed].Add(1)
		return false, false, fmt.Errorf("malformed replay message of %d frames", len(msg.Frames))
	}
	if bytes.Equal(f[0], endSeq) {
		return true, false, nil
	}
	seq := int64(binary.BigEndian.Uint64(f[0])) //nolint:gosec // the wire carries the bits
	if *verify {
		*verify = false
		if seq == from && maphash.Bytes(s.seed, f[1]) != s.lastSum {
			return false, true, nil
		}
	}
	if seq < s.next || seq >= upto {
		return false, false, nil // delivered already, or to come live
	}
	if seq > s.next {
		s.reset(fmt.Sprintf("replay starts at batch %d, needed %d", seq, s.next))
	}
	s.deliver(seq, f[1])
	return false, false, nil
}

// replayFrames returns a replay message's [sequence, payload] frames.
// The engines differ: SGLang and earlier vLLM send [sequence, payload],
// vLLM now [topic, sequence, payload] (its end marker with an empty
// topic), and either may arrive after the empty delimiter frame of the
// ROUTER-DEALER envelope; an early vLLM ended a replay with an empty
// frame instead of the end sequence. ok is false for anything else.
func replayFrames(f [][]byte) (_ [][]byte, ok bool) {
	if len(f) == 2 && len(f[0]) == 0 && len(f[1]) == 0 {
		return [][]byte{endSeq, nil}, true
	}
	if len(f) >= 3 && len(f[0]) == 0 {
		f = f[1:] // the delimiter (or an empty topic: the same either way)
	}
	if len(f) == 3 {
		f = f[1:] // the topic
	}
	return f, len(f) == 2 && len(f[0]) == 8
}

// deliver decodes batch seq and hands it to the handler.
func (s *Subscriber) deliver(seq int64, payload []byte) {
	s.next = seq + 1
	s.seq.Store(seq)
	s.lastSum = maphash.Bytes(s.seed, payload)
	s.havePrev = true
	b, err := DecodeWithin(payload, DecodeFactor*s.o.MaxEventBytes)
	if err != nil {
		s.decodeErrors.Add(1)
		r := Undecodable
		if errors.Is(err, ErrDecodeBudget) {
			r = DecodeTooLarge
		}
		s.rejectMsg(r, "kv events: batch left out", zap.Int64("seq", seq), zap.Int("bytes", len(payload)), zap.Error(err))
		s.reset(fmt.Sprintf("batch %d cannot be read: %v", seq, err))
		return
	}
	if s.suspect.Load() { // the first good batch after a rejection
		s.suspect.Store(false)
		s.live.Store(true)
	}
	s.batches.Add(1)
	s.events.Add(uint64(len(b.Events)))
	s.skipped.Add(uint64(b.Skipped)) //nolint:gosec // a count, never negative
	if b.TS > 0 && !math.IsInf(b.TS, 0) {
		sec, frac := math.Modf(b.TS)
		sent := time.Unix(int64(sec), int64(frac*1e9))
		s.lastLag.Store(int64(time.Since(sent)))
	}
	s.o.Handler.Apply(b)
}

// skipTo moves on to sequence next without the batches before it.
func (s *Subscriber) skipTo(next int64) {
	s.next = next
	s.havePrev = false
}

func (s *Subscriber) reset(reason string) {
	s.resets.Add(1)
	s.warn.Warn("reset", "kv events: state reset", zap.String("detail", reason))
	s.o.Handler.Reset(reason)
}

// RankEndpoint is the endpoint data-parallel rank r of an engine publishes
// on, given the endpoint it was configured with: vLLM adds r to a TCP port
// (and appends "_dp<r>" to an inproc name). Rank 0 is endpoint itself.
func RankEndpoint(endpoint string, rank int) (string, error) {
	if rank < 0 {
		return "", fmt.Errorf("kvevents: negative data-parallel rank %d", rank)
	}
	if rank == 0 {
		return endpoint, nil
	}
	if strings.HasPrefix(endpoint, "inproc://") {
		return fmt.Sprintf("%s_dp%d", endpoint, rank), nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if !strings.HasPrefix(endpoint, "tcp://") || i < len("tcp://") {
		return "", fmt.Errorf("kvevents: cannot offset the port of %q", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port <= 0 || port+rank > 65535 {
		return "", fmt.Errorf("kvevents: cannot offset the port of %q by %d", endpoint, rank)
	}
	return endpoint[:i+1] + strconv.Itoa(port+rank), nil
}
