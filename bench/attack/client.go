package attack

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// chatBody is a small chat request; stream makes it a streamed one.
func chatBody(stream bool, extra string) string {
	s := `{"model":"` + Model + `","messages":[{"role":"user","content":"hello"}]`
	if stream {
		s += `,"stream":true`
	}
	return s + extra + "}"
}

// rawRequest is a request head and body as sent on the wire.
func rawRequest(method, target, host string, headers []string, body string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", method, target, host)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.Bytes()
}

// chatRequest is POST /v1/chat/completions with body and headers, JSON.
func chatRequest(host string, body string, headers ...string) []byte {
	return rawRequest("POST", "/v1/chat/completions", host, append([]string{"Content-Type: application/json"}, headers...), body)
}

// Answer is a response read by the hostile client.
type Answer struct {
	Status  int
	Header  http.Header
	Body    []byte
	Elapsed time.Duration // from the request's last byte to the whole answer
	Err     error
}

// dialTCP connects to addr within timeout.
func dialTCP(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.DialContext(context.Background(), "tcp", addr)
}

// do sends raw on a new connection to addr and reads one answer, within timeout.
func do(addr string, raw []byte, timeout time.Duration) Answer {
	c, err := dialTCP(addr, timeout)
	if err != nil {
		return Answer{Err: err}
	}
	defer func() { _ = c.Close() }()
	return roundTrip(c, bufio.NewReader(c), raw, timeout)
}

// roundTrip sends raw on c and reads one answer from br, within timeout.
func roundTrip(c net.Conn, br *bufio.Reader, raw []byte, timeout time.Duration) Answer {
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(raw); err != nil {
		return Answer{Err: err}
	}
	start := time.Now()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return Answer{Err: err, Elapsed: time.Since(start)}
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return Answer{Status: resp.StatusCode, Header: resp.Header, Body: body, Elapsed: time.Since(start), Err: err}
}

// client is one kept-alive connection of the hostile client.
type client struct {
	c  net.Conn
	br *bufio.Reader
}

func dial(addr string) (*client, error) {
	c, err := dialTCP(addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &client{c: c, br: bufio.NewReader(c)}, nil
}

func (k *client) do(raw []byte, timeout time.Duration) Answer {
	return roundTrip(k.c, k.br, raw, timeout)
}

func (k *client) close() { _ = k.c.Close() }

// holders is a set of connections the hostile client keeps open.
type holders struct {
	mu    sync.Mutex
	conns []net.Conn
	fails int
}

// open dials n connections to addr in parallel and writes first on each.
func (h *holders) open(addr string, n int, first func(i int) []byte) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 128)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := dialTCP(addr, 5*time.Second)
			if err == nil && first != nil {
				// A kvroute that stops reading must not hold this up.
				_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
				_, err = c.Write(first(i))
				_ = c.SetWriteDeadline(time.Time{})
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if err != nil {
				h.fails++
				if c != nil {
					_ = c.Close()
				}
				return
			}
			h.conns = append(h.conns, c)
		}()
	}
	wg.Wait()
}

// answers reads, within wait, the answer each held connection has got
// (nil where none came).
func (h *holders) answers(wait time.Duration) []*Answer {
	h.mu.Lock()
	conns := append([]net.Conn(nil), h.conns...)
	h.mu.Unlock()
	out := make([]*Answer, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(wait))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return
			}
			body, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			out[i] = &Answer{Status: resp.StatusCode, Header: resp.Header, Body: body}
		}()
	}
	wg.Wait()
	return out
}

// closeAll closes every held connection.
func (h *holders) closeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns = nil
}

// declaredBody is a request declaring a body of n bytes and sending one.
func declaredBody(host string, n int) []byte {
	return []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(n) + "\r\n\r\n{")
}

// isOpenAIError reports whether body is an OpenAI-style error object.
func isOpenAIError(body []byte) bool {
	return bytes.HasPrefix(bytes.TrimSpace(body), []byte(`{"error":`)) || strings.Contains(string(body), `"error": {`)
}
