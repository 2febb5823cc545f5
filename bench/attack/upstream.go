package attack

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Model is the model the hostile upstream serves and every request names.
const Model = "attack-model"

// ModeHeader is the request header that chooses the hostile upstream's
// answer (one of the Mode* values); without it the answer is normal.
const ModeHeader = "X-Attack-Mode"

// The hostile upstream's answers, chosen per request by ModeHeader.
const (
	ModeNormal     = "normal"      // a small chat completion, kept alive
	ModeInject     = "inject"      // the answer, then a second response (X-Injected: yes) in the same write
	ModeInjectLate = "inject-late" // the answer, then the second response 30 ms later on the idle connection
	ModeBig        = "big"         // a 10 MB answer of known length
	ModeEndless    = "endless"     // an SSE stream, one small event every 100 ms, until the connection closes
	ModeFirehose   = "firehose"    // an SSE stream of 16 KB events as fast as the connection takes them
	ModeSwitch     = "101"         // 101 Switching Protocols, then silence
	ModeBareLF     = "bare-lf"     // a response head whose lines end in LF only
)

// BigAnswerBytes is the size of a ModeBig answer.
const BigAnswerBytes = 10 << 20

var (
	chatAnswer = []byte(`{"id":"chatcmpl-attack","object":"chat.completion","created":1700000000,"model":"` + Model +
		`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}`)
	modelsAnswer  = []byte(`{"object":"list","data":[{"id":"` + Model + `","object":"model","created":1700000000,"owned_by":"attack"}]}`)
	metricsAnswer = []byte(`# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192",model_name="` + Model + `"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="` + Model + `"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="` + Model + `"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="` + Model + `"} 0
`)
	injected = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Injected: yes\r\nContent-Length: 2\r\n\r\n{}"
)

// Seen is what the hostile upstream received in one request.
type Seen struct {
	Method, Target, Host string
	Headers              []string // raw header lines, as received
	BodyBytes            int
	Mode                 string
}

// Header returns the value of the first header named name (case-insensitive)
// and whether there was one.
func (s Seen) Header(name string) (string, bool) {
	for _, h := range s.Headers {
		k, v, ok := strings.Cut(h, ":")
		if ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// Upstream is the hostile upstream: a vLLM look-alike on raw TCP.
type Upstream struct {
	ln   net.Listener
	wg   sync.WaitGroup
	done chan struct{}

	mu    sync.Mutex
	seen  []Seen // the last 1000 forwarded (non-probe) requests
	conns map[net.Conn]struct{}

	// Streams counts the streams (endless, firehose) open now.
	Streams atomic.Int64
	// StreamsClosed counts the streams that ended because the connection
	// was closed by kvroute.
	StreamsClosed atomic.Int64
	// StreamBytes counts the bytes written in firehose streams.
	StreamBytes atomic.Int64
	lastClose   atomic.Int64 // unix nanoseconds of the last stream closed
}

// StartUpstream serves the hostile upstream on 127.0.0.1.
func StartUpstream() (*Upstream, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &Upstream{ln: ln, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	u.wg.Add(1)
	go u.accept()
	return u, nil
}

// URL is the upstream's base URL.
func (u *Upstream) URL() string { return "http://" + u.ln.Addr().String() }

// Addr is the upstream's host:port.
func (u *Upstream) Addr() string { return u.ln.Addr().String() }

// Close stops the upstream and closes its connections.
func (u *Upstream) Close() {
	select {
	case <-u.done:
		return
	default:
	}
	close(u.done)
	_ = u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		_ = c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// Seen returns the forwarded requests received so far (the last 1000).
func (u *Upstream) Seen() []Seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Seen(nil), u.seen...)
}

// LastStreamClose is when the last stream ended by a closed connection.
func (u *Upstream) LastStreamClose() time.Time {
	n := u.lastClose.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

func (u *Upstream) accept() {
	defer u.wg.Done()
	for {
		c, err := u.ln.Accept()
		if err != nil {
			return
		}
		u.mu.Lock()
		u.conns[c] = struct{}{}
		u.mu.Unlock()
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			u.serve(c)
			u.mu.Lock()
			delete(u.conns, c)
			u.mu.Unlock()
			_ = c.Close()
		}()
	}
}

// errBadRequest ends a connection whose request the upstream can't parse.
var errBadRequest = errors.New("bad request")

// readRequest reads one request head and its body (Content-Length or
// chunked, discarded), byte for byte as sent.
func readRequest(br *bufio.Reader) (Seen, error) {
	var s Seen
	line, err := br.ReadString('\n')
	if err != nil {
		return s, err
	}
	parts := strings.Fields(line)
	if len(parts) != 3 {
		return s, errBadRequest
	}
	s.Method, s.Target = parts[0], parts[1]
	length, chunked := 0, false
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return s, err
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		s.Headers = append(s.Headers, line)
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "host":
			s.Host = v
		case "content-length":
			length, _ = strconv.Atoi(v)
		case "transfer-encoding":
			chunked = strings.Contains(strings.ToLower(v), "chunked")
		case strings.ToLower(ModeHeader):
			s.Mode = v
		}
	}
	if chunked {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return s, err
			}
			size, err := strconv.ParseInt(strings.TrimSpace(strings.SplitN(line, ";", 2)[0]), 16, 64)
			if err != nil {
				return s, errBadRequest
			}
			if size == 0 {
				for { // trailers, recorded as header lines prefixed "trailer "
					t, err := br.ReadString('\n')
					if err != nil {
						return s, err
					}
					if t = strings.TrimRight(t, "\r\n"); t == "" {
						return s, nil
					}
					s.Headers = append(s.Headers, "trailer "+t)
				}
			}
			n, err := io.CopyN(io.Discard, br, size+2)
			s.BodyBytes += int(max(n-2, 0))
			if err != nil {
				return s, err
			}
		}
	}
	n, err := io.CopyN(io.Discard, br, int64(length))
	s.BodyBytes = int(n)
	return s, err
}

func (u *Upstream) serve(c net.Conn) {
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		s, err := readRequest(br)
		if err != nil {
			return
		}
		switch {
		case s.Method == http.MethodGet && s.Target == "/health":
			writeAnswer(c, "text/plain", []byte("ok"))
			continue
		case s.Method == http.MethodGet && s.Target == "/v1/models":
			writeAnswer(c, "application/json", modelsAnswer)
			continue
		case s.Method == http.MethodGet && s.Target == "/metrics":
			writeAnswer(c, "text/plain; version=0.0.4", metricsAnswer)
			continue
		}
		u.mu.Lock()
		if len(u.seen) >= 1000 {
			u.seen = append(u.seen[:0], u.seen[500:]...)
		}
		u.seen = append(u.seen, s)
		u.mu.Unlock()
		if !u.answer(c, s.Mode) {
			return
		}
	}
}

func writeAnswer(c net.Conn, ct string, body []byte) bool {
	head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n", ct, len(body))
	_, err := c.Write(append([]byte(head), body...))
	return err == nil
}

// answer writes the answer of mode; false ends the connection.
func (u *Upstream) answer(c net.Conn, mode string) bool {
	switch mode {
	case ModeInject:
		head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(chatAnswer))
		_, err := c.Write([]byte(head + string(chatAnswer) + injected))
		return err == nil
	case ModeInjectLate:
		if !writeAnswer(c, "application/json", chatAnswer) {
			return false
		}
		time.Sleep(30 * time.Millisecond)
		_, err := c.Write([]byte(injected))
		return err == nil
	case ModeBig:
		head := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", BigAnswerBytes)
		if _, err := c.Write([]byte(head)); err != nil {
			return false
		}
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for left := BigAnswerBytes; left > 0; left -= len(chunk) {
			if _, err := c.Write(chunk[:min(len(chunk), left)]); err != nil {
				return false
			}
		}
		return true
	case ModeEndless, ModeFirehose:
		u.stream(c, mode == ModeFirehose)
		return false
	case ModeSwitch:
		_, _ = c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
		select { // hold the connection, say nothing
		case <-u.done:
		case <-time.After(30 * time.Second):
		}
		return false
	case ModeBareLF:
		_, err := c.Write([]byte("HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n{}"))
		return err == nil
	default:
		return writeAnswer(c, "application/json", chatAnswer)
	}
}

// stream writes SSE events until a write fails (kvroute closed the
// connection) or the upstream closes.
func (u *Upstream) stream(c net.Conn, firehose bool) {
	u.Streams.Add(1)
	defer u.Streams.Add(-1)
	if _, err := c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")); err != nil {
		return
	}
	content := "x"
	if firehose {
		content = strings.Repeat("x", 16<<10)
	}
	event := `data: {"id":"chatcmpl-attack","object":"chat.completion.chunk","model":"` + Model + `","choices":[{"index":0,"delta":{"content":"` + content + `"}}]}` + "\n\n"
	chunk := []byte(strconv.FormatInt(int64(len(event)), 16) + "\r\n" + event + "\r\n")
	for {
		select {
		case <-u.done:
			return
		default:
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Minute))
		if _, err := c.Write(chunk); err != nil {
			u.StreamsClosed.Add(1)
			u.lastClose.Store(time.Now().UnixNano())
			return
		}
		if firehose {
			u.StreamBytes.Add(int64(len(chunk)))
		} else {
			time.Sleep(100 * time.Millisecond)
		}
	}
}
