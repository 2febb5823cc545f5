package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Mode is an injector's fault mode.
type Mode int

// The fault modes.
const (
	// ModeNormal passes everything to the replica.
	ModeNormal Mode = iota
	// ModeKilled: listener closed, open connections reset, new ones refused.
	ModeKilled
	// ModeHang: requests are read and never answered; streams stall.
	ModeHang
	// ModeError500: every POST gets 500 with an OpenAI error body.
	ModeError500
	// ModeGarbageMetrics: GET /metrics returns random bytes.
	ModeGarbageMetrics
)

func (m Mode) String() string {
	switch m {
	case ModeNormal:
		return "normal"
	case ModeKilled:
		return "killed"
	case ModeHang:
		return "hang"
	case ModeError500:
		return "error500"
	case ModeGarbageMetrics:
		return "garbage_metrics"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// RequestIDHeader carries each request's unique ID.
const RequestIDHeader = "X-Request-Id"

// error500Body is the body of an injected 500, as vLLM words an internal error.
const error500Body = `{"error":{"message":"chaos: injected internal server error","type":"InternalServerError","param":null,"code":500}}`

// Injector serves one replica's handler on a fixed 127.0.0.1 address behind
// a fault switch. Its methods are safe for concurrent use.
type Injector struct {
	index int
	addr  string
	next  http.Handler
	rec   *Recorder
	srv   *http.Server
	done  chan struct{} // closed by Close
	serve chan struct{} // closed when Serve returns

	mu     sync.Mutex
	mode   Mode
	modeCh chan struct{} // closed and replaced at every mode change
	ln     net.Listener  // nil while killed
	lnCh   chan struct{} // closed and replaced when ln changes
	conns  map[*trackedConn]struct{}
	closed bool
	resets int // connections reset by kills
}

// NewInjector listens on a free 127.0.0.1 port outside the ephemeral range
// (so that the port can be bound again after a kill) and serves next behind
// the fault switch, recording request IDs into rec as replica index. ctx
// bounds the listen.
func NewInjector(ctx context.Context, index int, next http.Handler, rec *Recorder) (*Injector, error) {
	ln, err := listenStable(ctx)
	if err != nil {
		return nil, err
	}
	inj := &Injector{
		index:  index,
		addr:   ln.Addr().String(),
		next:   next,
		rec:    rec,
		done:   make(chan struct{}),
		serve:  make(chan struct{}),
		modeCh: make(chan struct{}),
		ln:     ln,
		lnCh:   make(chan struct{}),
		conns:  make(map[*trackedConn]struct{}),
	}
	inj.srv = &http.Server{
		Handler:           inj,
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if tc, ok := c.(*trackedConn); ok {
				return context.WithValue(ctx, connKey{}, tc)
			}
			return ctx
		},
	}
	go func() {
		defer close(inj.serve)
		_ = inj.srv.Serve(&switchListener{inj: inj})
	}()
	return inj, nil
}

// listenStable listens on a random 127.0.0.1 port below the kernel's
// ephemeral range: an outgoing connection can never take such a port while
// the replica is killed, so it can listen on it again. It falls back to any
// free port.
func listenStable(ctx context.Context) (net.Listener, error) {
	lo := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				lo = v
			}
		}
	}
	var lc net.ListenConfig
	for range 64 {
		port := 10000 + rand.IntN(lo-10000)
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			return ln, nil
		}
	}
	return lc.Listen(ctx, "tcp", "127.0.0.1:0")
}

// URL is the replica's base URL, the same across kills.
func (inj *Injector) URL() string { return "http://" + inj.addr }

// Mode returns the current mode.
func (inj *Injector) Mode() Mode {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return inj.mode
}

// Resets returns the number of connections reset by kills so far.
func (inj *Injector) Resets() int {
	inj.mu.Lock()
	defer inj.mu.Unlock()
	return inj.resets
}

// SetMode switches the fault mode. Entering ModeKilled closes the listener
// and resets every open connection; leaving it listens again on the same
// address (retrying for up to 5 s).
func (inj *Injector) SetMode(m Mode) error {
	inj.mu.Lock()
	if inj.closed {
		inj.mu.Unlock()
		return net.ErrClosed
	}
	old := inj.mode
	inj.mode = m
	close(inj.modeCh)
	inj.modeCh = make(chan struct{})
	var reset []*trackedConn
	if m == ModeKilled && inj.ln != nil {
		_ = inj.ln.Close()
		inj.ln = nil
		close(inj.lnCh)
		inj.lnCh = make(chan struct{})
		for c := range inj.conns {
			reset = append(reset, c)
		}
		clear(inj.conns)
		inj.resets += len(reset)
	}
	inj.mu.Unlock()
	for _, c := range reset {
		c.reset()
	}
	if old == ModeKilled && m != ModeKilled {
		return inj.relisten()
	}
	return nil
}

// relisten binds the address again after a kill.
func (inj *Injector) relisten() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var lc net.ListenConfig
	for {
		ln, err := lc.Listen(ctx, "tcp", inj.addr)
		if err == nil {
			inj.mu.Lock()
			if inj.closed || inj.mode == ModeKilled {
				inj.mu.Unlock()
				_ = ln.Close()
				return nil
			}
			inj.ln = ln
			close(inj.lnCh)
			inj.lnCh = make(chan struct{})
			inj.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("chaos: replica %d: listening again on %s: %w", inj.index, inj.addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Close stops serving: it closes the listener and every connection and
// releases hung requests.
func (inj *Injector) Close() {
	inj.mu.Lock()
	if inj.closed {
		inj.mu.Unlock()
		<-inj.serve
		return
	}
	inj.closed = true
	close(inj.done)
	if inj.ln != nil {
		_ = inj.ln.Close()
	}
	inj.mu.Unlock()
	_ = inj.srv.Close()
	<-inj.serve
}

// waitNotHung blocks while the mode is ModeHang; it returns an error if ctx
// ends or the injector closes first.
func (inj *Injector) waitNotHung(ctx context.Context) error {
	for {
		inj.mu.Lock()
		m, ch := inj.mode, inj.modeCh
		inj.mu.Unlock()
		if m != ModeHang {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-inj.done:
			return net.ErrClosed
		}
	}
}

// ServeHTTP applies the current mode to one request.
func (inj *Injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(RequestIDHeader)
	if tc, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
		if !tc.begin(inj, id) {
			// Read before a kill reset the connection, handled after:
			// the killed replica never saw it, and kvroute may have
			// been answered elsewhere since.
			panic(http.ErrAbortHandler)
		}
	} else if id != "" {
		inj.rec.arrive(id, inj.index)
	}
	switch inj.Mode() {
	case ModeHang:
		// Read, never answered, never closed (until the client gives up:
		// with the body read, the server notices the client closing).
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-inj.done:
		}
		// Abort: returning would make the server write an empty 200 on
		// the connection the client just gave up.
		panic(http.ErrAbortHandler)
	case ModeError500:
		if r.Method == http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(error500Body))
			return
		}
	case ModeGarbageMetrics:
		if r.URL.Path == "/metrics" {
			b := make([]byte, 64+rand.IntN(4096))
			for i := range b {
				b[i] = byte(rand.Uint32())
			}
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			_, _ = w.Write(b)
			return
		}
	}
	sw := &stallWriter{ResponseWriter: w, inj: inj, ctx: r.Context()}
	inj.next.ServeHTTP(sw, r)
	if sw.aborted || r.Context().Err() != nil {
		// The client went away (kvroute gave up on the replica): write
		// nothing more, not even the empty 200 the server would send for
		// a handler that returned without a word, as a real engine's server
		// does not.
		panic(http.ErrAbortHandler)
	}
}

// stallWriter holds back a response's writes and flushes while the
// injector hangs, so that a hang also freezes responses in progress.
// Once a stalled write gives up (the client went away), every later write
// fails too.
type stallWriter struct {
	http.ResponseWriter
	inj     *Injector
	ctx     context.Context
	aborted bool // only the handler's goroutine writes
}

func (s *stallWriter) wait() error {
	if s.aborted {
		return net.ErrClosed
	}
	if err := s.inj.waitNotHung(s.ctx); err != nil {
		s.aborted = true
		return err
	}
	return nil
}

func (s *stallWriter) Write(p []byte) (int, error) {
	if err := s.wait(); err != nil {
		return 0, err
	}
	return s.ResponseWriter.Write(p)
}

func (s *stallWriter) FlushError() error {
	if err := s.wait(); err != nil {
		return err
	}
	return http.NewResponseController(s.ResponseWriter).Flush()
}

func (s *stallWriter) Flush() { _ = s.FlushError() }

func (s *stallWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// switchListener is the listener the injector's server accepts on: it
// follows the injector's current listener, waiting while it is killed.
type switchListener struct{ inj *Injector }

func (l *switchListener) Accept() (net.Conn, error) {
	inj := l.inj
	for {
		inj.mu.Lock()
		closed, ln, changed := inj.closed, inj.ln, inj.lnCh
		inj.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if ln == nil {
			select {
			case <-changed:
			case <-inj.done:
			}
			continue
		}
		c, err := ln.Accept()
		if err != nil {
			inj.mu.Lock()
			replaced := inj.ln != ln || inj.closed
			inj.mu.Unlock()
			if replaced {
				continue // killed or closed: follow the switch
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return nil, err
		}
		tc := &trackedConn{Conn: c, inj: inj}
		inj.mu.Lock()
		if inj.ln != ln || inj.closed {
			inj.mu.Unlock()
			tc.reset() // accepted just as the replica was killed
			continue
		}
		inj.conns[tc] = struct{}{}
		inj.mu.Unlock()
		return tc, nil
	}
}

func (l *switchListener) Close() error {
	l.inj.mu.Lock()
	defer l.inj.mu.Unlock()
	if !l.inj.closed {
		l.inj.closed = true
		close(l.inj.done)
		if l.inj.ln != nil {
			_ = l.inj.ln.Close()
		}
	}
	return nil
}

func (l *switchListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", l.inj.addr)
	return a
}

type connKey struct{}

// trackedConn is one accepted connection. It attributes the bytes written
// on it to the request being answered (set by begin), and can be reset.
type trackedConn struct {
	net.Conn
	inj *Injector

	mu         sync.Mutex
	cur        *Attempt
	peerClosed bool // a read saw the client close the connection
	wasReset   bool // reset (a kill) closed it
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	var ne net.Error
	if err != nil && (!errors.As(err, &ne) || !ne.Timeout()) {
		// EOF or reset. (A timeout is the server interrupting its own
		// background read, not the client.)
		c.mu.Lock()
		c.peerClosed = true
		c.mu.Unlock()
	}
	return n, err
}

// begin records the arrival of request id (none when empty) at inj and
// marks the start of its answer on the connection: from now on written
// bytes belong to its attempt (to nobody without an id). HTTP/1.1 answers requests
// on one connection in order, so everything written until the next begin
// is this request's response. It reports false, recording nothing, when a
// kill reset the connection first: the arrival is recorded before the
// reset or not at all, so no attempt is recorded after the failure that
// made kvroute try another replica.
func (c *trackedConn) begin(inj *Injector, id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.wasReset {
		return false
	}
	c.cur = nil
	if id != "" {
		c.cur = inj.rec.arrive(id, inj.index)
	}
	return true
}

func (c *trackedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.mu.Lock()
		if c.cur != nil {
			c.cur.wrote(p[:n], c.peerClosed)
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.inj.mu.Lock()
	delete(c.inj.conns, c)
	c.inj.mu.Unlock()
	return c.Conn.Close()
}

// reset closes the connection with an RST (SO_LINGER 0), as a crashed
// process's connections end.
func (c *trackedConn) reset() {
	c.mu.Lock()
	c.wasReset = true
	c.mu.Unlock()
	if tcp, ok := c.Conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = c.Conn.Close()
}

// Recorder records, per request ID, every replica the request reached and
// what each put on the wire in answer. It is safe for concurrent use.
type Recorder struct {
	start time.Time
	mu    sync.Mutex
	seq   int
	byID  map[string][]*Attempt
}

// NewRecorder returns an empty recorder; times are measured from start.
func NewRecorder(start time.Time) *Recorder {
	return &Recorder{start: start, byID: make(map[string][]*Attempt)}
}

func (r *Recorder) arrive(id string, replica int) *Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	a := &Attempt{Replica: replica, Seq: r.seq, At: time.Since(r.start), rec: r, firstOut: -1}
	r.byID[id] = append(r.byID[id], a)
	return a
}

// Attempts returns copies of the attempts of request id, in arrival order.
func (r *Recorder) Attempts(id string) []AttemptInfo {
	r.mu.Lock()
	as := r.byID[id]
	r.mu.Unlock()
	out := make([]AttemptInfo, len(as))
	for i, a := range as {
		out[i] = a.info()
	}
	return out
}

// IDs returns every request ID recorded.
func (r *Recorder) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.byID))
	for id := range r.byID {
		ids = append(ids, id)
	}
	return ids
}

// Attempt is one arrival of a request at a replica and what the replica
// wrote back on the wire.
type Attempt struct {
	Replica int
	Seq     int
	At      time.Duration

	rec       *Recorder
	mu        sync.Mutex
	firstOut  time.Duration // when the first byte went on the wire; -1 before
	status    int
	line      []byte // the status line until its CRLF
	headDone  bool
	tail      uint32 // last 4 bytes written, to find the end of the headers
	headBytes int64
	bodyBytes int64
	lateBytes int64
}

// wrote accounts for bytes the replica put on the wire for this attempt;
// late marks bytes written after the client closed the connection, which
// no longer answer anybody.
func (a *Attempt) wrote(p []byte, late bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if late {
		a.lateBytes += int64(len(p))
		return
	}
	if a.firstOut < 0 {
		a.firstOut = time.Since(a.rec.start)
	}
	for i, b := range p {
		if a.headDone {
			a.bodyBytes += int64(len(p) - i)
			return
		}
		a.headBytes++
		if a.status == 0 && len(a.line) < 64 {
			a.line = append(a.line, b)
			if i := bytes.Index(a.line, []byte("\r\n")); i >= 0 {
				if f := strings.Fields(string(a.line[:i])); len(f) >= 2 {
					a.status, _ = strconv.Atoi(f[1])
				}
			}
		}
		a.tail = a.tail<<8 | uint32(b)
		if a.tail == 0x0d0a0d0a { // "\r\n\r\n"
			a.headDone = true
		}
	}
}

// AttemptInfo is a snapshot of an Attempt.
type AttemptInfo struct {
	Replica int `json:"replica"`
	// Seq orders attempts across replicas.
	Seq int `json:"seq"`
	// AtMs is the arrival time from the start of the run, in milliseconds.
	AtMs float64 `json:"at_ms"`
	// Status is the status line's code on the wire; 0 if none was sent.
	Status int `json:"status"`
	// HeadBytes and BodyBytes count what was written on the wire.
	HeadBytes int64 `json:"head_bytes"`
	BodyBytes int64 `json:"body_bytes"`
	// LateBytes counts bytes written after the client had closed the
	// connection (not in HeadBytes or BodyBytes).
	LateBytes int64 `json:"late_bytes,omitempty"`
	// FirstOutMs is when the first response byte went on the wire, from
	// the start of the run, in milliseconds; -1 if none did.
	FirstOutMs float64 `json:"first_out_ms"`
}

// AnsweredBefore reports whether the attempt had put a response kvroute
// relays (a status line below 500) on the wire before atMs: a generation
// that reached, or was on its way to, the client by then.
func (a AttemptInfo) AnsweredBefore(atMs float64) bool {
	return a.Status > 0 && a.Status < 500 && a.FirstOutMs >= 0 && a.FirstOutMs < atMs
}

func (a *Attempt) info() AttemptInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := -1.0
	if a.firstOut >= 0 {
		first = ms(a.firstOut)
	}
	return AttemptInfo{Replica: a.Replica, Seq: a.Seq, AtMs: ms(a.At), Status: a.status, HeadBytes: a.headBytes, BodyBytes: a.bodyBytes, LateBytes: a.lateBytes, FirstOutMs: first}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
