package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The ZMQ library (zmq4) allocates a frame's body at the size its header
// declares, before reading a byte of it: one header declaring 1 TiB ends
// the process. The subscriber's sockets therefore dial through guarded
// transports ("kvroute+tcp", "kvroute+ipc") whose connections read the
// ZMTP 3.x framing as the bytes pass and fail the read that completes a
// header declaring more than the bound, before zmq4 has the size. The
// guard also holds back the next message while the messages read and not
// yet handled (released) reach a window, so that what zmq4 queues is
// bounded too.

// DefaultMaxEventBytes is SubOptions.MaxEventBytes when it is 0: 16 MiB.
const DefaultMaxEventBytes = 16 << 20

// maxCommandBytes bounds a ZMTP command frame (READY, SUBSCRIBE, PING):
// engines send a few hundred bytes.
const maxCommandBytes = 64 << 10

// maxWindow bounds the bytes of messages read ahead of the handler: a new
// message is read only while less than min(maxWindow, the message bound)
// is held.
const maxWindow = 1 << 20

// ZMTP 3.x framing: a 64-byte greeting, then frames of a flags byte and a
// size of 1 byte or, with flagLong, 8 bytes big-endian.
const (
	greetingBytes = 64
	flagMore      = 0x01
	flagLong      = 0x02
	flagCommand   = 0x04
	flagReserved  = 0xf8
)

// Reject is why a connection or a message was refused.
type Reject int

// The reasons, the label values of kvroute_kv_events_rejected_total.
const (
	// FrameTooLarge: a frame's header declared more than the bound.
	FrameTooLarge Reject = iota
	// MessageTooLarge: a multipart message's frames added up past it.
	MessageTooLarge
	// BadFraming: bytes that are not ZMTP framing (reserved flag bits, a
	// command inside a multipart message).
	BadFraming
	// Malformed: a message that is not [topic, sequence, payload] (or a
	// replay's [sequence, payload]).
	Malformed
	// Undecodable: a payload that is not an event batch.
	Undecodable
	// DecodeTooLarge: a payload whose decoding needs more memory than
	// its budget (see SubOptions.MaxEventBytes).
	DecodeTooLarge
	// PeerRefused: a connection to a listening subscriber (SubOptions.Bind)
	// from an address it does not allow, or one that did not finish its
	// ZMTP handshake in time; the publisher's own connection is not
	// disturbed.
	PeerRefused
	numRejects
)

var rejectNames = [numRejects]string{"frame_too_large", "message_too_large", "bad_framing", "malformed", "undecodable", "decode_too_large", "peer_refused"}

// String is the reason's label value.
func (r Reject) String() string {
	if r < 0 || r >= numRejects {
		return "unknown"
	}
	return rejectNames[r]
}

// Rejects counts rejections by reason (indexed by Reject).
type Rejects [numRejects]uint64

// Each calls fn with every reason and its count, in order.
func (rs Rejects) Each(fn func(reason string, n uint64)) {
	for i, n := range rs {
		fn(Reject(i).String(), n)
	}
}

// Total is the sum over the reasons.
func (rs Rejects) Total() uint64 {
	var t uint64
	for _, n := range rs {
		t += n
	}
	return t
}

// guardedPrefix names the guarded transports: "kvroute+tcp" dials as "tcp".
const guardedPrefix = "kvroute+"

func init() {
	for _, network := range []struct{ zmq, net string }{{"tcp", "tcp"}, {"ipc", "unix"}} {
		if err := zmq4.RegisterTransport(guardedPrefix+network.zmq, guardTransport{network.net}); err != nil {
			panic(err)
		}
	}
}

// guarded is endpoint on its guarded transport; an in-process endpoint
// (inproc://, a test's own publisher) is returned as it is.
func guarded(endpoint string) string {
	for _, p := range []string{"tcp://", "ipc://"} {
		if strings.HasPrefix(endpoint, p) {
			return guardedPrefix + endpoint
		}
	}
	return endpoint
}

// guard is the bound of one socket's connections and what they hold. A
// socket's ctx carries it (withGuard) to guardTransport.Dial. Safe for
// concurrent use.
type guard struct {
	max    int64        // bytes a frame, and a message, may declare
	window int64        // read ahead while less than this is held
	reject func(Reject) // called at each rejection; must not block

	mu    sync.Mutex
	cond  sync.Cond
	held  int64       // data bytes read and not yet released
	conns []net.Conn  // dialed or accepted and not closed, for shutdown
	peer  *guardConn  // a listening socket's publisher (see guardListener)
	bind  *bindPolicy // how a listening socket admits connections; nil: it does not listen
}

func newGuard(maxBytes int64, reject func(Reject)) *guard {
	g := &guard{max: maxBytes, window: min(maxBytes, maxWindow), reject: reject}
	g.cond.L = &g.mu
	return g
}

type guardKey struct{}

func withGuard(ctx context.Context, g *guard) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

// admit counts n data bytes read.
func (g *guard) admit(n int64) {
	g.mu.Lock()
	g.held += n
	g.mu.Unlock()
}

// release says n data bytes, of one message, were handled.
func (g *guard) release(n int64) {
	g.mu.Lock()
	g.held = max(g.held-n, 0)
	g.mu.Unlock()
	g.cond.Broadcast()
}

// await blocks while the window is full; false once c is closed.
func (g *guard) await(c *guardConn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for g.held >= g.window && !c.closed {
		g.cond.Wait()
	}
	return !c.closed
}

// shutdown closes every connection of the guard still open: zmq4 leaves
// open one whose handshake failed.
func (g *guard) shutdown() {
	g.mu.Lock()
	conns := slices.Clone(g.conns)
	g.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// track wraps c, dialed or accepted, in a guardConn and keeps it until it
// is closed.
func (g *guard) track(c net.Conn) *guardConn {
	gc := &guardConn{Conn: c, g: g, greet: greetingBytes}
	g.mu.Lock()
	g.conns = append(g.conns, gc)
	g.mu.Unlock()
	return gc
}

// closed says c is closed: its reader stops waiting and the guard forgets
// it.
func (g *guard) closed(c *guardConn) {
	g.mu.Lock()
	c.closed = true
	if i := slices.Index(g.conns, net.Conn(c)); i >= 0 {
		g.conns = slices.Delete(g.conns, i, i+1)
	}
	lost := g.peer == c
	if lost {
		g.peer = nil
	}
	g.mu.Unlock()
	g.cond.Broadcast()
	if lost && g.bind.onPeer != nil {
		g.bind.onPeer(false)
	}
}

// guardTransport dials network and wraps the connection in a guardConn.
type guardTransport struct{ network string }

var _ transport.Transport = guardTransport{}

func (t guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	g, _ := ctx.Value(guardKey{}).(*guard)
	if g == nil {
		return nil, errors.New("kvevents: a guarded transport dialed without its bound")
	}
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return g.track(c), nil
}

func (t guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	g, _ := ctx.Value(guardKey{}).(*guard)
	if g == nil || g.bind == nil {
		return nil, errors.New("kvevents: a guarded transport listened without its bound")
	}
	l, err := (&net.ListenConfig{}).Listen(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return &guardListener{Listener: l, ctx: ctx, g: g}, nil
}

func (t guardTransport) Addr(ep string) (string, error) { return transport.New(t.network).Addr(ep) }

// errRejected is the read error of a guardConn past a rejection.
type errRejected struct{ r Reject }

func (e errRejected) Error() string {
	return "kvevents: connection refused by its bound: " + e.r.String()
}

// guardConn follows the ZMTP framing of what is read through it. Reads are
// cut at every element (greeting, header, body) so that the guard sees a
// header whole before the bytes after it pass. Read is called from one
// goroutine at a time (zmq4's reader of the connection).
type guardConn struct {
	net.Conn
	g *guard

	greet int64   // greeting bytes still to come
	hdr   [9]byte // the current frame's header, hn bytes of it read
	hn    int
	body  int64 // body bytes of the current frame still to come
	msg   int64 // data bytes of the current message so far
	more  bool  // the current message has frames to come
	cmd   bool  // the current frame is a command
	err   error // sticky, once rejected

	// shook is called once the peer's first command (its READY, which ends
	// the handshake) is read whole; nil when no one waits for it.
	shook  func()
	closed bool // guarded by g.mu
	once   sync.Once
}

func (c *guardConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	switch {
	case c.greet > 0:
		n, err := c.Conn.Read(p[:min(int64(len(p)), c.greet)])
		c.greet -= int64(n)
		return n, err
	case c.body > 0:
		n, err := c.Conn.Read(p[:min(int64(len(p)), c.body)])
		c.body -= int64(n)
		if c.body == 0 {
			c.frameDone()
		}
		return n, err
	}
	if c.hn == 0 && !c.more && !c.g.await(c) {
		return 0, net.ErrClosed
	}
	need := 2
	if c.hn > 0 && c.hdr[0]&flagLong != 0 {
		need = 9
	}
	n, err := c.Conn.Read(p[:min(len(p), need-c.hn)])
	copy(c.hdr[c.hn:], p[:n])
	c.hn += n
	if c.hn >= 1 {
		if r, bad := c.checkFlags(); bad {
			return 0, c.fail(r)
		}
	}
	if c.hn == 2 && c.hdr[0]&flagLong != 0 {
		// The long size's first byte: it cannot be read alone by zmq4,
		// which reads the other seven next.
		return n, err
	}
	if c.hn == need {
		if r, bad := c.frame(); bad {
			return 0, c.fail(r)
		}
		if c.body == 0 {
			c.frameDone()
		}
	}
	return n, err
}

// frameDone is called when the current frame has been read whole.
func (c *guardConn) frameDone() {
	if c.cmd && c.shook != nil {
		c.shook()
		c.shook = nil
	}
}

// checkFlags checks the current frame's flags byte.
func (c *guardConn) checkFlags() (Reject, bool) {
	f := c.hdr[0]
	switch {
	case f&flagReserved != 0:
		return BadFraming, true
	case f&flagCommand != 0 && (f&flagMore != 0 || c.more):
		// A command is one frame, never part of a message.
		return BadFraming, true
	}
	return 0, false
}

// frame checks the header read whole and moves on to its body.
func (c *guardConn) frame() (Reject, bool) {
	f := c.hdr[0]
	var size uint64
	if f&flagLong != 0 {
		size = binary.BigEndian.Uint64(c.hdr[1:9])
	} else {
		size = uint64(c.hdr[1])
	}
	c.hn = 0
	c.cmd = f&flagCommand != 0
	if c.cmd {
		if size > uint64(min(c.g.max, maxCommandBytes)) { //nolint:gosec // positive
			return FrameTooLarge, true
		}
		c.body = int64(size) //nolint:gosec // bounded just above
		return 0, false
	}
	if size > uint64(c.g.max) { //nolint:gosec // positive
		return FrameTooLarge, true
	}
	if c.msg+int64(size) > c.g.max { //nolint:gosec // bounded just above
		return MessageTooLarge, true
	}
	c.body = int64(size) //nolint:gosec // bounded above
	c.msg += c.body
	c.g.admit(c.body)
	c.more = f&flagMore != 0
	if !c.more {
		c.msg = 0
	}
	return 0, false
}

func (c *guardConn) fail(r Reject) error {
	c.err = errRejected{r}
	if c.g.reject != nil {
		c.g.reject(r)
	}
	return c.err
}

func (c *guardConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.g.closed(c) })
	return err
}
