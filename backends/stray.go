package backends

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvroute/kvroute/sockio"
)

// errStaleConn fails the first write of a request on a pooled connection
// that must not be reused: the replica sent bytes outside an answer (after
// one ended, or while the connection was idle), closed it, or sent an
// answer whose framing kvroute could not follow. Nothing of the request has
// been sent, so the clients retry it at once on another connection
// (staleRetries).
var errStaleConn = errors.New("replica connection not reusable: bytes outside an answer, or closed by the replica")

// staleRetries bounds how many stale pooled connections one request may
// meet (each is closed) before it fails with errStaleConn.
const staleRetries = 8

// retryStale is the clients' RetryIfErr: it retries a request on another
// connection only when the write of it failed before a byte was sent
// because the pooled connection was stale.
func retryStale(_ *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) {
	return false, errors.Is(err, errStaleConn)
}

// tlsProbeWait is how long crypto/tls may take, when a pooled TLS
// connection has bytes waiting at reuse, to show whether they are records
// of its own (session tickets, key updates) or application data.
const tlsProbeWait = 2 * time.Millisecond

// ErrBadResponseHead is the read error of a proxied connection
// ([Replica.Client]) whose response head kvroute does not accept (see
// framer.checkHeads): a line ending in a bare LF, or status 101 Switching
// Protocols. fasthttp's header parser passes it on wrapped; one refused at
// an answer's very first byte reaches the caller as a connection closed
// early.
var ErrBadResponseHead = errors.New("replica sent a malformed or unsupported response head")

// strayGuard wraps every replica connection, below any timedConn, and keeps a kept-alive connection from carrying anything stray into the
// next request, as nginx's keepalive module does: it follows the framing
// of each answer as it is read (framer), so it knows where the answer
// ends, and a connection that received bytes past that end, in the same
// read or a later one, or that has bytes waiting (or its end of stream)
// when it is about to be reused, is closed instead: the first write of the
// next request fails with errStaleConn before anything is sent, fasthttp
// closes the connection and the client retries on another one
// (retryStale). The check at reuse is one non-blocking peek at the socket
// (MSG_PEEK|MSG_DONTWAIT), a system call per reused connection; over TLS
// also a read with a deadline already past, which crypto/tls answers from
// what it holds without a system call.
//
// A connection is used by one request at a time, handed over through the
// client's pool, so the fields need no locking.
type strayGuard struct {
	net.Conn           // the plaintext connection: the socket, or a *tls.Conn over it
	tc       *tls.Conn // the TLS connection, or nil
	sock     *peeker   // nil when the connection is not a socket
	raw      net.Conn  // the connection as dialed (TakeBody's)
	onStray  func()    // called when stray bytes are found, or nil
	fr       framer
	used     bool      // an answer was read on this connection
	stray    bool      // bytes came past the end of an answer
	rdl      time.Time // the read deadline last set through the guard

	// A chunked answer's body can be taken from fasthttp (TakeBody): the
	// read that ends the head delivers the head only (holds), the bytes
	// after it wait in held, not yet followed by the framer, and fresh
	// says nothing of the body was delivered since. replay is what Read
	// delivers next without reading: the end of a taken body, so that
	// fasthttp sees it end (Body.Finish).
	holds  bool
	fresh  bool
	held   []byte
	replay []byte
}

// newStrayGuard wraps c, the plaintext connection (tc when not nil), whose
// socket is sock (the connection as dialed).
func newStrayGuard(c net.Conn, tc *tls.Conn, sock net.Conn, onStray func()) *strayGuard {
	g := &strayGuard{Conn: c, tc: tc, onStray: onStray, raw: sock}
	if rc, ok := sockio.SyscallConn(sock); ok {
		g.sock = newPeeker(rc)
	}
	return g
}

func (g *strayGuard) Write(p []byte) (int, error) {
	switch {
	case len(p) == 0 || g.fr.awaiting():
		// More of the request being written.
	case g.fr.state != frIdle:
		// An answer not over by its framing, or one the framer could not
		// follow (fasthttp closes such connections itself, so this is a
		// disagreement): not reused.
		return 0, errStaleConn
	case g.used && !g.reusable():
		return 0, errStaleConn
	default:
		g.fr.start(len(p) >= 5 && string(p[:5]) == "HEAD ")
	}
	return g.Conn.Write(p)
}

// Read follows what it reads with the framer. A refused head (framer
// checkHeads) delivers the bytes before the refused one, if any, and fails
// that read or the next with ErrBadResponseHead, and every read after it:
// fasthttp closes a connection whose read failed.
func (g *strayGuard) Read(p []byte) (int, error) {
	if len(g.replay) > 0 {
		n := copy(p, g.replay)
		g.replay = g.replay[n:]
		return n, nil
	}
	g.fresh = false
	if g.fr.state == frRefused {
		return 0, ErrBadResponseHead
	}
	var n int
	var err error
	if len(g.held) > 0 {
		n = g.takeHeld(p)
	} else {
		n, err = g.Conn.Read(p)
	}
	if n > 0 && g.follow(p[:n], &n) {
		g.markStray()
	}
	switch g.fr.state {
	case frIdle:
		g.used = true
	case frRefused:
		if g.fr.bad == 0 {
			return 0, ErrBadResponseHead
		}
		return g.fr.bad, nil
	}
	return n, err
}

// follow feeds the framer b, the bytes just read. On a connection that
// holds, when a final head ends in b and a chunked body follows it, the
// body's bytes are kept back in held and *n cut to the head's end.
func (g *strayGuard) follow(b []byte, n *int) (stray bool) {
	toHead := g.holds && g.fr.state == frHead
	used, _, stray := g.fr.follow(b, false, toHead)
	if !toHead || used == len(b) && g.fr.state != frChunkSize {
		return stray
	}
	if g.fr.state == frChunkSize && g.fr.digits == 0 && !g.fr.ext {
		// A copy of its own, gone with the answer: an idle pooled
		// connection keeps none.
		g.held = append([]byte(nil), b[used:]...)
		g.fresh = true
		*n = used
		return stray
	}
	return g.fr.feed(b[used:])
}

// takeHeld copies the held body bytes into p and returns how many.
func (g *strayGuard) takeHeld(p []byte) int {
	n := copy(p, g.held)
	if g.held = g.held[n:]; len(g.held) == 0 {
		g.held = nil
	}
	return n
}

func (g *strayGuard) markStray() {
	if !g.stray && g.onStray != nil {
		g.onStray()
	}
	g.stray = true
}

func (g *strayGuard) SetDeadline(t time.Time) error {
	g.rdl = t
	return g.Conn.SetDeadline(t)
}

func (g *strayGuard) SetReadDeadline(t time.Time) error {
	g.rdl = t
	return g.Conn.SetReadDeadline(t)
}

// reusable reports whether the connection, whose last answer is over, may
// carry another request.
func (g *strayGuard) reusable() bool {
	if g.stray {
		return false
	}
	// Plaintext crypto/tls read along with the answer's last record.
	if g.tc != nil && !g.tlsQuiet(time.Unix(1, 0)) {
		return false
	}
	switch g.sock.peek() {
	case peekClosed:
		return false
	case peekData:
		if g.tc == nil {
			g.markStray()
			return false
		}
		if !g.tlsQuiet(time.Now().Add(tlsProbeWait)) {
			return false
		}
		// What is left, if anything, is part of a record.
		return g.sock.peek() != peekData
	}
	return true
}

// tlsQuiet reads from the TLS connection until deadline and reports
// whether nothing came: no application data, no end of stream.
func (g *strayGuard) tlsQuiet(deadline time.Time) bool {
	if err := g.tc.SetReadDeadline(deadline); err != nil {
		return false
	}
	var b [1]byte
	n, err := g.tc.Read(b[:])
	if g.tc.SetReadDeadline(g.rdl) != nil {
		return false
	}
	if n > 0 {
		g.markStray()
		return false
	}
	return errors.Is(err, os.ErrDeadlineExceeded)
}

// Results of peeker.peek.
const (
	peekNothing = iota // nothing waiting, or not a socket
	peekData           // bytes waiting
	peekClosed         // end of stream or an error waiting
)

// Framer states.
const (
	frIdle      = iota // no request outstanding: fresh, or its answer over
	frHead             // reading a response head
	frBody             // a Content-Length body: left bytes to come
	frChunkSize        // a chunk-size line
	frChunkData        // chunk data: left bytes to come
	frChunkEnd         // the CRLF after chunk data: left bytes to come
	frTrailer          // the trailer section of a chunked body
	frUnknown          // framing not followed: never reused
	frRefused          // a head refused by the head checks: reads fail
)

// maxHead bounds the bytes the framer keeps of a response head line, and
// of all the heads of one answer that it follows the framing of; fasthttp
// reads far smaller heads (its read buffer).
const maxHead = 64 << 10

// maxInterim bounds the interim (1xx) heads before a final one whose
// framing the framer follows.
const maxInterim = 16

// framer follows the HTTP/1.1 framing of the answers read on a
// connection, as fasthttp reads them, to tell where each ends. An answer
// it cannot follow (no length: read until close, an unknown
// Transfer-Encoding, 101, a malformed head, heads past maxHead or
// maxInterim) leaves it in frUnknown once its final head is read:
// fasthttp closes such connections itself.
//
// Each response head is read once, a line at a time (headLines), and that
// one pass finds where the head ends, reads its status and framing, and,
// with checkHeads (proxied connections), refuses a head kvroute does not
// accept at the first byte it cannot pass on:
//   - a line ending in a bare LF. fasthttp tolerates one but keeps
//     waiting for a CRLF CRLF that never comes, until the first-byte
//     timeout runs out;
//   - status 101 Switching Protocols (at the end of its status line):
//     fasthttp hands it over as a final, body-less answer and returns the
//     connection to the pool, which would then carry the replica's
//     upgraded protocol to the next request.
//
// Interim answers (1xx other than 101) are read like the head that
// follows them, also past maxInterim; bodies, and bytes read with no
// request written, are not checked.
type framer struct {
	state      int
	checkHeads bool      // refuse the heads described above
	bad        int       // frRefused: the index of the refused byte in the bytes last fed
	head       bool      // the request is HEAD: its answer has no body
	reading    bool      // an answer byte came since the request
	hdr        []byte    // the current head line, up to maxHead bytes
	h          headState // the head being read (frHead)
	interim    int       // interim heads of this answer
	left       int64
	size       int64 // chunk size so far (frChunkSize)
	digits     int   // hex digits of it
	ext        bool  // past the size: OWS or a chunk extension
	line       int   // bytes of the current trailer line, CR excluded
}

// headState is what the framer has read of a response head besides its
// current line (framer.hdr).
type headState struct {
	cr      bool  // the last byte of the current line so far is CR
	long    bool  // the current line passed maxHead: not kept whole
	lines   int   // complete lines; empty ones before the status line are not counted
	kept    int64 // bytes of this answer's heads so far
	status  int   // from the status line, or 0
	http10  bool  // the status line's version is HTTP/1.0
	chunked bool  // Transfer-Encoding: chunked
	length  int64 // Content-Length, or -1
	lost    bool  // framing not followed: frUnknown once the final head ends
}

// start begins following the answer to a request just written.
func (f *framer) start(head bool) {
	*f = framer{state: frHead, head: head, hdr: f.hdr[:0], checkHeads: f.checkHeads, h: headState{length: -1}}
}

// awaiting reports whether a request was written and no byte of its answer
// came yet: a write now is more of the same request.
func (f *framer) awaiting() bool { return f.state == frHead && !f.reading }

// feed follows b, the next bytes read, and reports whether any of them lie
// past the end of an answer.
func (f *framer) feed(b []byte) (stray bool) {
	_, _, stray = f.follow(b, false, false)
	return stray
}

// follow follows b as feed does. With toHead it stops once a final head
// has ended, and used is the length of b up to there (else len(b)). With
// compact it moves the body's bytes (a Content-Length body's, or the data
// of chunks) to the front of b, in order, and payload is their length.
func (f *framer) follow(b []byte, compact, toHead bool) (used, payload int, stray bool) {
	if f.state != frIdle {
		f.reading = true
	}
	fed := len(b)
	orig := b
	for len(b) > 0 {
		switch f.state {
		case frIdle:
			return fed, payload, true
		case frUnknown, frRefused:
			return fed, payload, false
		case frHead:
			end, bad := f.headLines(b)
			if bad >= 0 {
				f.state, f.bad = frRefused, fed-len(b)+bad
				return fed, payload, false
			}
			if end < 0 {
				return fed, payload, false
			}
			b = b[end:]
			if toHead {
				return fed - len(b), payload, false
			}
		case frBody, frChunkData, frChunkEnd:
			k := int64(len(b))
			if k > f.left {
				k = f.left
			}
			if compact && f.state != frChunkEnd {
				payload += copy(orig[payload:], b[:k])
			}
			b, f.left = b[k:], f.left-k
			if f.left > 0 {
				return fed, payload, false
			}
			switch f.state {
			case frBody:
				f.state = frIdle
			case frChunkData:
				f.state, f.left = frChunkEnd, 2
			default:
				f.state, f.size, f.digits, f.ext = frChunkSize, 0, 0, false
			}
		case frChunkSize:
			b = f.chunkSize(b)
		case frTrailer:
			b = f.trailer(b)
		}
	}
	return fed, payload, false
}

// headLines reads b, the next bytes of the answer's heads, a line at a
// time, up to the end of its final head. It returns the index in b just
// past that end, the framer then past frHead, or -1 when the heads go on
// past b; and the index of the first byte refused (checkHeads), or -1.
func (f *framer) headLines(b []byte) (end, bad int) {
	h := &f.h
	for off := 0; off < len(b); {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			f.keepLine(b[off:])
			return -1, -1
		}
		i += off
		f.keepLine(b[off:i])
		off = i + 1
		if !h.cr {
			if f.checkHeads {
				return -1, i
			}
			f.state = frUnknown // fasthttp reads a bare LF; the framer does not follow it
			return len(b), -1
		}
		var line []byte // the line without its CR; nil when long
		if !h.long {
			line = f.hdr[:len(f.hdr)-1]
		}
		empty := len(f.hdr) == 1
		f.hdr, h.cr, h.long = f.hdr[:0], false, false
		switch {
		case !empty:
			if h.lines++; h.lines == 1 {
				f.statusLine(line)
				if h.status == 101 && f.checkHeads {
					return -1, i
				}
			} else if !h.lost {
				f.fieldLine(line)
			}
		case h.lines > 0: // the empty line that ends the head
			if f.endHead(); f.state != frHead {
				return off, -1
			}
		}
		// An empty line before the status line is skipped, as fasthttp does.
	}
	return -1, -1
}

// keepLine adds b, bytes of the current head line, to f.hdr, past maxHead
// only noting that the line is long, and counts them towards maxHead.
func (f *framer) keepLine(b []byte) {
	if len(b) == 0 {
		return
	}
	h := &f.h
	h.cr = b[len(b)-1] == '\r'
	if h.kept += int64(len(b)); h.kept > maxHead {
		h.lost = true
	}
	if room := maxHead - len(f.hdr); len(b) > room {
		b, h.long = b[:room], true
	}
	f.hdr = append(f.hdr, b...)
}

// statusLine reads a head's status line (nil when long: past maxHead) as
// fasthttp does: a version HTTP/d.d, spaces, a code of exactly three
// digits, then a space or the line's end. Its framing is followed for
// HTTP/1.0 and HTTP/1.1 only.
func (f *framer) statusLine(line []byte) {
	h := &f.h
	h.status = 0
	if len(line) < 9 || line[8] != ' ' || string(line[:5]) != "HTTP/" || line[6] != '.' ||
		!isDigit(line[5]) || !isDigit(line[7]) {
		h.lost = true
		return
	}
	code := bytes.TrimLeft(line[9:], " ")
	if sp := bytes.IndexByte(code, ' '); sp >= 0 {
		code = code[:sp]
	}
	if len(code) != 3 || !isDigit(code[0]) || !isDigit(code[1]) || !isDigit(code[2]) {
		h.lost = true
		return
	}
	h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	switch string(line[5:8]) {
	case "1.0":
		h.http10 = true
	case "1.1":
	default:
		h.lost = true
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// fieldLine reads a head's field line (nil when long) for the answer's
// framing (Content-Length, Transfer-Encoding).
func (f *framer) fieldLine(line []byte) {
	h := &f.h
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		h.lost = true
		return
	}
	name := bytes.TrimRight(line[:colon], " \t")
	value := bytes.Trim(line[colon+1:], " \t")
	switch {
	case bytes.EqualFold(name, []byte("Content-Length")):
		if h.length >= 0 || len(value) == 0 || len(value) > 18 {
			h.lost = true
			return
		}
		h.length = 0
		for _, c := range value {
			if c < '0' || c > '9' {
				h.lost = true
				return
			}
			h.length = h.length*10 + int64(c-'0')
		}
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		if h.http10 {
			return // fasthttp ignores it in an HTTP/1.0 answer
		}
		if h.chunked || !bytes.EqualFold(value, []byte("chunked")) {
			h.lost = true
			return
		}
		h.chunked = true
	}
}

// endHead sets what follows a head that just ended: another head after an
// interim one, else the body its framing gives.
func (f *framer) endHead() {
	h := &f.h
	status := h.status
	if status >= 100 && status < 200 && status != 101 {
		f.interim++
		// The next head: framing lost stays lost, the counts go on.
		f.h = headState{length: -1, kept: h.kept, lost: h.lost || f.interim > maxInterim}
		return
	}
	f.state = frUnknown
	switch {
	case h.lost || status == 101:
	case f.head || status == 204 || status == 304:
		f.state = frIdle
	case h.chunked:
		f.state, f.size, f.digits, f.ext = frChunkSize, 0, 0, false
	case h.length == 0:
		f.state = frIdle
	case h.length > 0:
		f.state, f.left = frBody, h.length
	}
}

// chunkSize follows a chunk-size line: hex digits, then optional spaces and
// a chunk extension, up to LF. It returns the bytes after what it used.
func (f *framer) chunkSize(b []byte) []byte {
	for i, c := range b {
		switch {
		case c == '\n':
			if f.digits == 0 {
				f.state = frUnknown
				return nil
			}
			if f.size == 0 {
				f.state, f.line = frTrailer, 0
			} else {
				f.state, f.left = frChunkData, f.size
			}
			return b[i+1:]
		case f.ext:
		case hexValue(c) >= 0:
			if f.digits++; f.digits > 15 {
				f.state = frUnknown
				return nil
			}
			f.size = f.size<<4 | int64(hexValue(c))
		default:
			f.ext = true // ';', OWS or CR: fasthttp refuses what it must
		}
	}
	return nil
}

func hexValue(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// trailer follows the trailer section, which an empty line ends. It
// returns the bytes after what it used.
func (f *framer) trailer(b []byte) []byte {
	for i, c := range b {
		switch c {
		case '\n':
			if f.line == 0 {
				f.state = frIdle
				return b[i+1:]
			}
			f.line = 0
		case '\r':
		default:
			f.line++
		}
	}
	return nil
}
