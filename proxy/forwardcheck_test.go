package proxy

import (
	"errors"
	"io"
	"net"
	"strings"
	"testing"
)

func TestValidFieldNames(t *testing.T) {
	tests := []struct {
		raw  string
		want bool
	}{
		{"", true},
		{"\r\n", true},
		{"Host: x\r\nContent-Type: application/json\r\n\r\n", true},
		{"X-Odd!#$%&'*+-.^_`|~09az: v\r\n\r\n", true},
		{"X-Folded: a\r\n  b\r\nHost: x\r\n\r\n", true},
		{"Host: x\nX-Bare-LF: y\n\n", true},
		{"X Bad: 1\r\n\r\n", false},
		{"Host: x\r\nX-Bad : 1\r\n\r\n", false},
		{"X(Bad): 1\r\n\r\n", false},
		{"X\"Bad\": 1\r\n\r\n", false},
		{"X-Bad\x7f: 1\r\n\r\n", false},
		{"X-Bad\xc3\xa9: 1\r\n\r\n", false},
		{": no name\r\n\r\n", false},
		{"no colon\r\n\r\n", false},
	}
	for _, tt := range tests {
		if got := validFieldNames([]byte(tt.raw)); got != tt.want {
			t.Errorf("validFieldNames(%q) = %v, want %v", tt.raw, got, tt.want)
		}
	}
}

func TestMethodAllowed(t *testing.T) {
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
		if !methodAllowed([]byte(m)) {
			t.Errorf("%s refused", m)
		}
		if !strings.Contains(allowedMethods, m) {
			t.Errorf("%s missing from the Allow value %q", m, allowedMethods)
		}
	}
	for _, m := range []string{"CONNECT", "TRACE", "PROPFIND", "get", "Post", "BREW", ""} {
		if methodAllowed([]byte(m)) {
			t.Errorf("%q allowed", m)
		}
	}
}

// scriptConn is a net.Conn whose reads return the given pieces in turn,
// then io.EOF; writes are discarded.
type scriptConn struct {
	net.Conn
	pieces []string
}

func (c *scriptConn) Read(p []byte) (int, error) {
	if len(c.pieces) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.pieces[0])
	if n == len(c.pieces[0]) {
		c.pieces = c.pieces[1:]
	} else {
		c.pieces[0] = c.pieces[0][n:]
	}
	return n, nil
}

func (c *scriptConn) Write(p []byte) (int, error) { return len(p), nil }

// readAll reads g until an error and returns what it delivered and the
// error, io.EOF when the script ran out.
func readAll(g *headGuard) (string, error) {
	var sb strings.Builder
	buf := make([]byte, 7) // small: heads arrive over many reads
	for {
		n, err := g.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			return sb.String(), err
		}
	}
}

func TestHeadGuard(t *testing.T) {
	tests := []struct {
		name      string
		pieces    []string
		delivered string // the bytes read before the refusal
		refused   bool
	}{
		{"good head and body", []string{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\na\nb"}, "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\na\nb", false},
		{"interim then final", []string{"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"}, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", false},
		{"empty line before the status line", []string{"\r\nHTTP/1.1 200 OK\r\n\r\n\n"}, "\r\nHTTP/1.1 200 OK\r\n\r\n\n", false},
		{"status 1010 is no 101", []string{"HTTP/1.1 1010 X\r\n\r\n"}, "HTTP/1.1 1010 X\r\n\r\n", false},
		{"bare LF on the status line", []string{"HTTP/1.1 200 OK\nX: y\r\n\r\n"}, "HTTP/1.1 200 OK", true},
		{"bare LF first", []string{"\nHTTP/1.1 200 OK\r\n\r\n"}, "", true},
		{"bare-LF blank line", []string{"HTTP/1.1 200 OK\r\nX: y\r\n\n"}, "HTTP/1.1 200 OK\r\nX: y\r\n", true},
		{"CR and LF in separate reads", []string{"HTTP/1.1 200 OK\r", "\nX: y\n\r\n"}, "HTTP/1.1 200 OK\r\nX: y", true},
		{"101", []string{"HTTP/1.1 101 Switching Protocols\r\n\r\n"}, "HTTP/1.1 101", true},
		{"101 without a reason", []string{"HTTP/1.1 101\r\n\r\n"}, "HTTP/1.1 101", true},
		{"101 split", []string{"HTTP/1.1 1", "0", "1 Switching Protocols\r\n\r\n"}, "HTTP/1.1 101", true},
		{"101 after an interim", []string{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\n\r\n"}, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101", true},
		{"bare LF in an interim head", []string{"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\n\r\n"}, "HTTP/1.1 100 Continue", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newHeadGuard(&scriptConn{pieces: append([]string(nil), tt.pieces...)})
			if _, err := g.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
				t.Fatal(err)
			}
			got, err := readAll(g)
			if got != tt.delivered {
				t.Errorf("delivered %q, want %q", got, tt.delivered)
			}
			if refused := errors.Is(err, errBadResponseHead); refused != tt.refused {
				t.Fatalf("read error %v, refused %v, want %v", err, refused, tt.refused)
			}
			if tt.refused {
				if _, err := g.Read(make([]byte, 8)); !errors.Is(err, errBadResponseHead) {
					t.Errorf("a read after the refusal: %v", err)
				}
			}
		})
	}
}

// The bytes that come with no request outstanding, and the body after a
// head, are not checked; the next request's answer is.
func TestHeadGuardChecksHeadsOnly(t *testing.T) {
	c := &scriptConn{pieces: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n", "\n\n"}}
	g := newHeadGuard(c)
	if got, err := readAll(g); err != io.EOF || got != "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n" {
		t.Fatalf("unrequested bytes: %q %v", got, err)
	}
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.pieces = []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n"}
	if got, err := readAll(g); err != io.EOF || got != "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\n\n" {
		t.Fatalf("body: %q %v", got, err)
	}
	_, _ = g.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	c.pieces = []string{"HTTP/1.1 200 OK\nContent-Length: 2\r\n\r\n{}"}
	if _, err := readAll(g); !errors.Is(err, errBadResponseHead) {
		t.Fatalf("the next head: %v", err)
	}
}

// The checks run on every request and every response head: they allocate
// nothing.
func TestForwardChecksAllocateNothing(t *testing.T) {
	raw := []byte("Host: kvroute.example\r\nContent-Type: application/json\r\nAuthorization: Bearer sk-x\r\nX-Session-ID: s1\r\nContent-Length: 61\r\n\r\n")
	method := []byte("POST")
	answer := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	script := []string{answer}
	c := &scriptConn{}
	g := newHeadGuard(c)
	req := []byte("POST / HTTP/1.1\r\n\r\n")
	buf := make([]byte, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		if !methodAllowed(method) || !validFieldNames(raw) {
			t.Fatal("refused")
		}
		c.pieces = script
		_, _ = g.Write(req)
		if n, err := g.Read(buf); err != nil || n != len(answer) {
			t.Fatalf("read %d %v", n, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request", allocs)
	}
}
