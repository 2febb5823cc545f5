package attack

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bench/child"
)

// baseline is the resident memory of an idle kvroute after its first
// request (which loads the vocabulary).
func baseline(k *kvroute) (Mem, error) {
	if !MemSupported {
		return Mem{}, errNoMem
	}
	if a := k.normal(10 * time.Second); a.Status != 200 {
		if a.Err != nil {
			return Mem{}, fmt.Errorf("first request: %d: %w", a.Status, a.Err)
		}
		return Mem{}, fmt.Errorf("first request: %d %.200s", a.Status, a.Body)
	}
	time.Sleep(300 * time.Millisecond)
	return ReadMem(k.pid())
}

// memRun is a memory attack's measurements.
type memRun struct {
	Base, During, Peak Mem
	Bound              Bound
	Normal             Answer // a normal request sent during the attack
	InFlight           float64
	// GoBase and GoDuring are the Go heap and stacks in use (goInUse)
	// before and during the attack: unlike RSS, not hidden by pages the
	// process freed earlier and still holds.
	GoBase, GoDuring int64
	// Gauges read during the attack: requests in flight (kvroute's own
	// count), client connections, bytes of request-body buffers; -1 where
	// this kvroute has no such gauge.
	ProxyInFlight, Conns, BodyBytes float64
}

// perUnit is the growth per unit: of the peak over the baseline, or of
// the Go heap and stacks, whichever is more (RSS growth hides in pages
// the process freed earlier and kept).
func (m memRun) perUnit(n int) int64 {
	return max(m.Peak.HWM-m.Base.RSS, m.GoDuring-m.GoBase) / int64(max(n, 1))
}

// underAttack measures k's baseline, runs attack (which opens its
// connections on h), waits settle, measures, sends a normal request, then
// closes the connections and reads the peak.
func underAttack(k *kvroute, h *holders, settle time.Duration, attack func() error) (memRun, error) {
	var m memRun
	var err error
	if m.Base, err = baseline(k); err != nil {
		return m, err
	}
	cfg, err := loaded(k)
	if err != nil {
		return m, err
	}
	m.Bound = Formula(cfg, m.Base.RSS)
	if _, err := k.heapAfterGC(); err != nil {
		return m, err
	}
	m.GoBase = k.goInUse()
	if err := attack(); err != nil {
		h.closeAll()
		return m, err
	}
	time.Sleep(settle)
	m.InFlight = k.sum("kvroute_backend_in_flight")
	m.GoDuring = k.goInUse()
	m.ProxyInFlight = k.gauge("kvroute_in_flight_requests")
	m.Conns = k.gauge("kvroute_client_connections")
	m.BodyBytes = k.gauge("kvroute_body_buffer_bytes")
	if m.During, err = ReadMem(k.pid()); err != nil {
		h.closeAll()
		return m, err
	}
	m.Normal = k.normal(10 * time.Second)
	h.closeAll()
	if !k.alive() {
		return m, fmt.Errorf("kvroute exited during the attack%s", tailOf(k))
	}
	m.Peak, err = ReadMem(k.pid())
	return m, err
}

// underFormula reads k's peak resident memory and the memory formula of
// k's configuration over the baseline base: an attack holds the process
// under the formula when peak.HWM is at most bound.Total.
func underFormula(k *kvroute, base int64) (peak Mem, bound Bound, err error) {
	cfg, err := loaded(k)
	if err != nil {
		return Mem{}, Bound{}, err
	}
	peak, err = ReadMem(k.pid())
	return peak, Formula(cfg, base), err
}

func tailOf(k *kvroute) string { return child.Tail(filepath.Join(k.dir, "kvroute.log")) }

// gaugeMiB formats a gauge's bytes, "n/a" when kvroute has no such gauge.
func gaugeMiB(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return mib(int64(v))
}

func normalOK(a Answer) bool { return a.Err == nil && a.Status == 200 }

func describe(a Answer) string {
	if a.Err != nil {
		return "error " + a.Err.Error()
	}
	return strconv.Itoa(a.Status)
}

// memoryAttack starts a kvroute of one replica under MemorySettings for
// the attack name, runs attack on it and its upstream, and stops both.
func (e *env) memoryAttack(name string, attack func(k *kvroute, up *Upstream) (Result, error)) (Result, error) {
	k, ups, stop, err := e.start(name, 1, MemorySettings())
	if err != nil {
		return Result{}, err
	}
	defer stop()
	return attack(k, ups[0])
}

// perFigure describes m's growth over n of what, per unit: "RSS +x for n
// what (y/unit; Go heap+stacks z/unit)".
func (m memRun) perFigure(n int, what, unit string) string {
	return fmt.Sprintf("RSS %s for %d %s (%s/%s; Go heap+stacks %s/%s)",
		signed(m.Peak.HWM-m.Base.RSS), n, what, mib(m.perUnit(n)), unit, mib((m.GoDuring-m.GoBase)/int64(n)), unit)
}

// boundFigure describes m's peak against the formula and the normal
// request sent during the attack.
func (m memRun) boundFigure() string {
	return fmt.Sprintf("peak %s, formula %s; normal request %s", mib(m.Peak.HWM), mib(m.Bound.Total), describe(m.Normal))
}

// failed is an error when any of the n connections h opened failed.
func (h *holders) failed(n int) error {
	if h.fails > 0 {
		return fmt.Errorf("%d of %d connections failed", h.fails, n)
	}
	return nil
}

// bodyFloodMem measures kvroute's memory while n connections each declare a body of limits.max_body_bytes
// and send one byte of it.
func bodyFloodMem(k *kvroute, n int) (memRun, error) {
	cfg, err := loaded(k)
	if err != nil {
		return memRun{}, err
	}
	h := &holders{}
	return underAttack(k, h, 1500*time.Millisecond, func() error {
		h.open(k.addr, n, func(int) []byte { return declaredBody(k.addr, cfg.Limits.MaxBodyBytes) })
		return h.failed(n)
	})
}

func bodyFlood(e *env) (Result, error) {
	return e.memoryAttack("body-flood", func(k *kvroute, _ *Upstream) (Result, error) {
		n := e.sizes.BodyFloodConns
		m, err := bodyFloodMem(k, n)
		if err != nil {
			return Result{}, err
		}
		*e.bound = m.Bound
		held := normalOK(m.Normal) && m.perUnit(n) < 1<<20 && m.Peak.HWM <= m.Bound.Total
		return Result{Held: held, Figure: m.perFigure(n, "conns declaring 8 MiB with 1 byte sent", "conn") + "; " + m.boundFigure()}, nil
	})
}

// partialBodiesMem measures kvroute's memory while n connections each declare a body of
// limits.max_body_bytes, send part bytes of it and wait, so that the
// bodies being read press on limits.max_body_buffer_bytes. It returns the
// run and how many connections got 503 body_budget_exhausted.
func partialBodiesMem(k *kvroute, n, part int) (memRun, int, error) {
	cfg, err := loaded(k)
	if err != nil {
		return memRun{}, 0, err
	}
	h := &holders{}
	refused := 0
	m, err := underAttack(k, h, 1500*time.Millisecond, func() error {
		body := append(declaredBody(k.addr, cfg.Limits.MaxBodyBytes), bytes.Repeat([]byte(" "), part)...)
		h.open(k.addr, n, func(int) []byte { return body })
		for _, a := range h.answers(200 * time.Millisecond) {
			if a != nil && a.Status == 503 && bytes.Contains(a.Body, []byte("body_budget_exhausted")) && a.Header.Get("Retry-After") != "" {
				refused++
			}
		}
		return nil
	})
	// Connections refused before the whole part was written failed to write.
	return m, refused + h.fails, err
}

func partialBodies(e *env) (Result, error) {
	return e.memoryAttack("partial-bodies", func(k *kvroute, _ *Upstream) (Result, error) {
		n, part := e.sizes.PartialBodies, 2<<20
		m, refused, err := partialBodiesMem(k, n, part)
		if err != nil {
			return Result{}, err
		}
		cfg, err := loaded(k)
		if err != nil {
			return Result{}, err
		}
		budget, hasBudget := Setting(cfg, "limits.max_body_buffer_bytes")
		growth := max(m.Peak.HWM-m.Base.RSS, m.GoDuring-m.GoBase)
		// Held: the bodies took no more than the budget (twice: the GC), the
		// connections' own buffers aside, and the process stayed under the formula.
		conns := int64(n) * (int64(cfg.Limits.MaxHeaderBytes) + ConnWriteBufferBytes + ConnOverheadBytes)
		held := hasBudget && growth <= GCFactor*(budget+conns) && m.BodyBytes <= float64(budget) && m.Peak.HWM <= m.Bound.Total && normalOK(m.Normal)
		return Result{Held: held, Figure: fmt.Sprintf("growth %s for %d conns each sending %s of a declared 8 MiB (body budget %s, body buffers %s); %d refused with 503 body_budget_exhausted; %s",
			signed(growth), n, mib(int64(part)), mib(budget), gaugeMiB(m.BodyBytes), refused, m.boundFigure())}, nil
	})
}

// unreadAnswersMem measures kvroute's memory while n clients ask for a
// 10 MB answer and never read it.
func unreadAnswersMem(k *kvroute, up *Upstream, n int) (memRun, error) {
	h := &holders{}
	return underAttack(k, h, 1500*time.Millisecond, func() error {
		before := countMode(up, ModeBig)
		h.open(k.addr, n, func(int) []byte {
			return chatRequest(k.addr, chatBody(false, ""), ModeHeader+": "+ModeBig)
		})
		if err := h.failed(n); err != nil {
			return err
		}
		deadline := time.Now().Add(10 * time.Second)
		for countMode(up, ModeBig)-before < n && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		return nil
	})
}

func countMode(up *Upstream, mode string) int {
	n := 0
	for _, s := range up.Seen() {
		if s.Mode == mode {
			n++
		}
	}
	return n
}

func unreadAnswers(e *env) (Result, error) {
	return e.memoryAttack("unread-answers", func(k *kvroute, up *Upstream) (Result, error) {
		n := e.sizes.UnreadAnswers
		m, err := unreadAnswersMem(k, up, n)
		if err != nil {
			return Result{}, err
		}
		inflight := m.InFlight
		if m.ProxyInFlight >= 0 {
			inflight = m.ProxyInFlight
		}
		held := normalOK(m.Normal) && m.perUnit(n) < 2<<20 && m.Peak.HWM <= m.Bound.Total && inflight >= float64(n)*0.9
		return Result{Held: held, Figure: fmt.Sprintf("%s, %.0f in flight; %s", m.perFigure(n, "unread 10 MB answers", "answer"), inflight, m.boundFigure())}, nil
	})
}

// idleConns measures a client connection's cost: n connections with an
// unfinished request head of nearly limits.max_header_bytes.
func idleConns(e *env) (Result, error) {
	return e.memoryAttack("idle-conns", func(k *kvroute, _ *Upstream) (Result, error) {
		n := e.sizes.IdleConns
		cfg, err := loaded(k)
		if err != nil {
			return Result{}, err
		}
		// Each head fills the read buffer but for its last 2 KiB, unfinished:
		// every page of the buffer is touched.
		head := []byte("GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", cfg.Limits.MaxHeaderBytes-2<<10))
		h := &holders{}
		m, err := underAttack(k, h, time.Second, func() error {
			h.open(k.addr, n, func(int) []byte { return head })
			return nil
		})
		if err != nil {
			return Result{}, err
		}
		if err := h.failed(n); err != nil {
			return Result{}, err
		}
		per := (m.GoDuring - m.GoBase) / int64(n)
		want := int64(cfg.Limits.MaxHeaderBytes) + ConnWriteBufferBytes + ConnOverheadBytes
		return Result{Held: per <= want && normalOK(m.Normal), Figure: fmt.Sprintf("Go heap+stacks %s/conn over %d conns with an unfinished %s head (formula %s/conn); RSS %s; normal request %s",
			signed(per), n, mib(int64(len(head))), mib(want), signed(m.During.RSS-m.Base.RSS), describe(m.Normal))}, nil
	})
}

// poolFull: holders keep streams open past both replicas' pools while
// normal requests are sent.
func poolFull(e *env) (Result, error) {
	const pool = 16
	k, ups, stop, err := e.start("pool-full", 2, Settings{"limits.max_conns_per_replica": pool, "limits.conn_wait": "300ms"})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	h := &holders{}
	defer h.closeAll()
	h.open(k.addr, e.sizes.PoolHolders, func(int) []byte {
		return chatRequest(k.addr, chatBody(true, ""), ModeHeader+": "+ModeEndless)
	})
	deadline := time.Now().Add(5 * time.Second)
	for ups[0].Streams.Load()+ups[1].Streams.Load() < 2*pool && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	streams := ups[0].Streams.Load() + ups[1].Streams.Load()
	const normals = 50
	var ok, refused, other atomic.Int64
	parallel(normals, 5, func(int) {
		a := k.normal(10 * time.Second)
		switch {
		case normalOK(a):
			ok.Add(1)
		case a.Status == 503 && a.Header.Get("Retry-After") != "" && isOpenAIError(a.Body):
			refused.Add(1)
		default:
			other.Add(1)
		}
	})
	ejections := k.sum("kvroute_backend_ejections_total")
	h.closeAll()
	// The streams end once kvroute sees their clients gone.
	deadline = time.Now().Add(10 * time.Second)
	for ups[0].Streams.Load()+ups[1].Streams.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	after := 0
	for range 20 {
		if normalOK(k.normal(10 * time.Second)) {
			after++
		}
	}
	held := ejections == 0 && other.Load() == 0 && after == 20
	return Result{Held: held, Figure: fmt.Sprintf("%.0f ejections with %d streams held (pools of %d); of %d normal requests %d ok, %d 503+Retry-After, %d other; after: %d/20 ok",
		ejections, streams, pool, normals, ok.Load(), refused.Load(), other.Load(), after)}, nil
}

// parallel runs f(0..n-1) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				f(i)
			}
		}()
	}
	wg.Wait()
}

// slowReader: clients ask for fast streams and never read them.
func slowReader(e *env) (Result, error) {
	s := Settings{"timeouts.client_write": "2s"}
	k, ups, stop, err := e.start("slow-reader", 1, s)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	const n = 4
	h := &holders{}
	defer h.closeAll()
	start := time.Now()
	h.open(k.addr, n, func(int) []byte {
		return chatRequest(k.addr, chatBody(true, ""), ModeHeader+": "+ModeFirehose)
	})
	deadline := time.Now().Add(15 * time.Second)
	for ups[0].StreamsClosed.Load() < n && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	closed := ups[0].StreamsClosed.Load()
	inflight := k.sum("kvroute_backend_in_flight")
	for wait := time.Now().Add(3 * time.Second); closed == n && inflight != 0 && time.Now().Before(wait); {
		time.Sleep(50 * time.Millisecond)
		inflight = k.sum("kvroute_backend_in_flight")
	}
	normal := k.normal(5 * time.Second)
	if closed < n {
		return Result{Held: false, Figure: fmt.Sprintf("%d of %d replica streams still held %.0f s after their clients stopped reading (%s relayed); %.0f in flight",
			n-closed, n, time.Since(start).Seconds(), mib(ups[0].StreamBytes.Load()), inflight)}, nil
	}
	took := ups[0].LastStreamClose().Sub(start)
	counted := k.sum("kvroute_client_write_timeouts_total")
	return Result{Held: inflight == 0 && counted >= n && normalOK(normal), Figure: fmt.Sprintf("%d of %d replica connections closed %.1f s after the clients stopped reading (timeouts.client_write 2s); %.0f counted as client write timeouts; %.0f in flight after; normal request %s",
		closed, n, took.Seconds(), counted, inflight, describe(normal))}, nil
}

// flood sends n requests made by req(i) on workers kept-alive connections
// and returns how many did not get 200.
func flood(addr string, n, workers int, req func(i int) []byte) int {
	var failed atomic.Int64
	var wg sync.WaitGroup
	var next atomic.Int64
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *client
			defer func() {
				if c != nil {
					c.close()
				}
			}()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if c == nil {
					var err error
					if c, err = dial(addr); err != nil {
						failed.Add(1)
						continue
					}
				}
				a := c.do(req(i), 10*time.Second)
				if !normalOK(a) {
					failed.Add(1)
				}
				if a.Err != nil || a.Header.Get("Connection") == "close" {
					c.close()
					c = nil
				}
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

// heapNoise is how much the in-use heap of an idle kvroute may differ
// between two measurements after collections without anything being kept
// (partly used spans, the runtime's and the metrics' own buffers).
const heapNoise = 1 << 20

// heapGrowth measures the kvroute heap after a collection before and after f.
func heapGrowth(k *kvroute, f func()) (int64, error) {
	h0, err := k.heapAfterGC()
	if err != nil {
		return 0, err
	}
	f()
	h1, err := k.heapAfterGC()
	return h1 - h0, err
}

// unique returns size bytes starting with i's digits.
func unique(i int, filler string) string {
	p := strconv.Itoa(i) + "-"
	return p + filler[len(p):]
}

// sessionFlood starts a kvroute of one replica under the session policy
// for the attack name, and measures its heap's growth while workers send
// it the n requests req makes for its address (flood); failed counts those
// that failed.
func (e *env) sessionFlood(name string, n, workers int, req func(addr string, i int) []byte) (growth int64, failed int, err error) {
	k, _, stop, err := e.start(name, 1, Settings{"policy": "session"})
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	growth, err = heapGrowth(k, func() {
		failed = flood(k.addr, n, workers, func(i int) []byte { return req(k.addr, i) })
	})
	return growth, failed, err
}

func sessionIDs(e *env) (Result, error) {
	n := e.sizes.SessionIDs
	filler := strings.Repeat("s", 16<<10)
	body := chatBody(false, "")
	growth, failed, err := e.sessionFlood("session-ids", n, 8, func(addr string, i int) []byte {
		return chatRequest(addr, body, "X-Session-ID: "+unique(i, filler))
	})
	if err != nil {
		return Result{}, err
	}
	per := growth / int64(n)
	return Result{Held: per < 1<<10 && failed == 0, Figure: fmt.Sprintf("heap %s after %d session IDs of 16 KB (%d B/ID); %d failed", signed(growth), n, per, failed)}, nil
}

func userFields(e *env) (Result, error) {
	n := e.sizes.UserFields
	filler := strings.Repeat("u", 1<<20)
	growth, failed, err := e.sessionFlood("user-fields", n, 4, func(addr string, i int) []byte {
		return chatRequest(addr, chatBody(false, `,"user":"`+unique(i, filler)+`"`))
	})
	if err != nil {
		return Result{}, err
	}
	per := growth / int64(n)
	// Held: well under the fields' own size, with room for the heap's own
	// noise between two measurements (a short run sends few fields).
	held := growth < int64(n)*(16<<10)+heapNoise && failed == 0
	return Result{Held: held, Figure: fmt.Sprintf("heap %s after %d user fields of 1 MB (%s/field); %d failed", signed(growth), n, signed(per), failed)}, nil
}

// strayBytes: a replica sends a second response after its answer, in the
// same write or later on the idle connection, while normal requests follow.
func strayBytes(e *env) (Result, error) {
	k, _, stop, err := e.start("stray-bytes", 1, nil)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	c, err := dial(k.addr)
	if err != nil {
		return Result{}, err
	}
	defer func() { c.close() }()
	answers, injectedSeen, failed := 0, 0, 0
	check := func(a Answer) {
		answers++
		if a.Header != nil && a.Header.Get("X-Injected") != "" {
			injectedSeen++
		}
		if !normalOK(a) {
			failed++
		}
	}
	keep := func(raw []byte) Answer {
		a := c.do(raw, 5*time.Second)
		if a.Err != nil {
			c.close()
			if nc, err := dial(k.addr); err == nil {
				c = nc
			}
		}
		return a
	}
	for i := range 40 {
		mode := ModeInject
		if i%2 == 1 {
			mode = ModeInjectLate
		}
		check(keep(chatRequest(k.addr, chatBody(false, ""), ModeHeader+": "+mode)))
		if mode == ModeInjectLate {
			time.Sleep(60 * time.Millisecond) // the late bytes reach the pooled connection
		}
		for range 3 {
			check(keep(chatRequest(k.addr, chatBody(false, ""))))
		}
		check(k.normal(5 * time.Second))
	}
	return Result{Held: injectedSeen == 0 && failed == 0, Figure: fmt.Sprintf("%d of %d answers carried X-Injected; %d failed", injectedSeen, answers, failed)}, nil
}

// tagged sends raw (which carries X-Attack-Tag: tag) and returns the
// answer and what the upstream saw of it.
func tagged(k *kvroute, up *Upstream, raw []byte, tag string) (Answer, *Seen) {
	a := do(k.addr, raw, 10*time.Second)
	for _, s := range up.Seen() {
		if v, _ := s.Header("X-Attack-Tag"); v == tag {
			return a, &s
		}
	}
	return a, nil
}

func absoluteHost(e *env) (Result, error) {
	k, ups, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	probes := []struct{ tag, method, path, host, body string }{
		{"abs-post", "POST", "/v1/chat/completions", "evil.example:9999", chatBody(false, "")},
		{"abs-get", http.MethodGet, "/x", "evil.example:9999", ""},
		{"abs-get-host", http.MethodGet, "/y", k.addr, ""}, // the Host header names kvroute, the target another host
	}
	held := true
	var figs []string
	for _, p := range probes {
		raw := rawRequest(p.method, "http://evil.example:9999"+p.path, p.host,
			[]string{"Content-Type: application/json", "X-Attack-Tag: " + p.tag}, p.body)
		a, s := tagged(k, ups[0], raw, p.tag)
		if s != nil {
			held = held && s.Host == ups[0].Addr() && strings.HasPrefix(s.Target, "/")
			figs = append(figs, fmt.Sprintf("%s %s: replica saw Host %s, target %s", p.method, p.path, s.Host, s.Target))
			continue
		}
		held = held && a.Status >= 400 && a.Status < 500
		figs = append(figs, fmt.Sprintf("%s %s: not forwarded, %s", p.method, p.path, describe(a)))
	}
	return Result{Held: held, Figure: strings.Join(figs, "; ") + " (replica: " + ups[0].Addr() + ")"}, nil
}

func connectMethod(e *env) (Result, error) {
	k, ups, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	a := do(k.addr, []byte("CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\nX-Attack-Tag: connect\r\n\r\n"), 5*time.Second)
	forwarded := false
	for _, s := range ups[0].Seen() {
		if s.Method == "CONNECT" {
			forwarded = true
		}
	}
	return Result{Held: a.Status == 405 && !forwarded && isOpenAIError(a.Body), Figure: fmt.Sprintf("answer %s (OpenAI error: %v); forwarded to the replica: %v", describe(a), isOpenAIError(a.Body), forwarded)}, nil
}

func noContentType(e *env) (Result, error) {
	k, ups, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	raw := rawRequest("POST", "/v1/chat/completions", k.addr, []string{"X-Attack-Tag: noct"}, chatBody(false, ""))
	a, s := tagged(k, ups[0], raw, "noct")
	if s == nil {
		return Result{Held: false, Figure: "not forwarded; answer " + describe(a)}, nil
	}
	ct, has := s.Header("Content-Type")
	if !has {
		ct = "(none)"
	}
	return Result{Held: !has && normalOK(a), Figure: fmt.Sprintf("replica saw Content-Type %s; answer %s", ct, describe(a))}, nil
}

func headerSpace(e *env) (Result, error) {
	k, ups, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	raw := chatRequest(k.addr, chatBody(false, ""), "Bad Name: x", "X-Attack-Tag: space")
	a, s := tagged(k, ups[0], raw, "space")
	forwarded := false
	if s != nil {
		for _, h := range s.Headers {
			if strings.HasPrefix(strings.ToLower(h), "bad name") {
				forwarded = true
			}
		}
	}
	return Result{Held: a.Status == 400 && !forwarded && isOpenAIError(a.Body), Figure: fmt.Sprintf("answer %s; forwarded verbatim: %v", describe(a), forwarded)}, nil
}

func chunkedTrailers(e *env) (Result, error) {
	k, ups, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	body := chatBody(false, "")
	raw := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: " + k.addr + "\r\nContent-Type: application/json\r\nX-Attack-Tag: trailer\r\nTransfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n" +
		strconv.FormatInt(int64(len(body)), 16) + "\r\n" + body + "\r\n0\r\nX-Trailer: smuggled\r\n\r\n")
	a, s := tagged(k, ups[0], raw, "trailer")
	if s == nil {
		return Result{Held: a.Status >= 400 && a.Status < 500, Figure: "not forwarded; answer " + describe(a)}, nil
	}
	_, asHeader := s.Header("X-Trailer")
	return Result{Held: !asHeader && normalOK(a), Figure: fmt.Sprintf("trailer forwarded as a header: %v; answer %s", asHeader, describe(a))}, nil
}

// fastFail: a replica's answer of mode must become a 502 at once.
func fastFail(e *env, mode string) (Result, error) {
	k, _, err := e.forwarding()
	if err != nil {
		return Result{}, err
	}
	a := do(k.addr, chatRequest(k.addr, chatBody(false, ""), ModeHeader+": "+mode), 10*time.Second)
	fig := fmt.Sprintf("%s in %.1f ms (timeouts.first_byte 5s)", describe(a), float64(a.Elapsed.Microseconds())/1000)
	return Result{Held: a.Status == 502 && a.Elapsed < 2*time.Second && isOpenAIError(a.Body), Figure: fig}, nil
}

func upstreamSwitch(e *env) (Result, error) { return fastFail(e, ModeSwitch) }

func bareLF(e *env) (Result, error) { return fastFail(e, ModeBareLF) }

func connCap(e *env) (Result, error) {
	const limit = 50
	k, _, stop, err := e.start("conn-cap", 1, Settings{"limits.max_connections": limit})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	h := &holders{}
	defer h.closeAll()
	h.open(k.addr, limit, func(int) []byte { return []byte("GET /v1/models HTTP/1.1\r\nHost: x\r\n") })
	time.Sleep(300 * time.Millisecond)
	n := e.sizes.ConnCapOverflow
	var good atomic.Int64
	var first Answer
	var once sync.Once
	parallel(n, 4, func(int) {
		a := do(k.addr, rawRequest(http.MethodGet, "/v1/models", k.addr, nil, ""), 5*time.Second)
		once.Do(func() { first = a })
		if a.Status == 503 && a.Header.Get("Retry-After") != "" && isOpenAIError(a.Body) {
			good.Add(1)
		}
	})
	ct := ""
	if first.Header != nil {
		ct = first.Header.Get("Content-Type")
	}
	return Result{Held: int(good.Load()) == n, Figure: fmt.Sprintf("%d of %d connections over the cap of %d got a JSON 503 with Retry-After (first: %s, %s %q)",
		good.Load(), n, limit, describe(first), ct, bytes.TrimSpace(first.Body[:min(len(first.Body), 60)]))}, nil
}

// idleKeepAlive: a kept-alive client connection left idle is closed after
// timeouts.client_idle.
func idleKeepAlive(e *env) (Result, error) {
	k, _, stop, err := e.start("idle-keepalive", 1, Settings{"timeouts.client_idle": "1s"})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	c, err := dial(k.addr)
	if err != nil {
		return Result{}, err
	}
	defer c.close()
	if a := c.do(chatRequest(k.addr, chatBody(false, "")), 10*time.Second); !normalOK(a) {
		return Result{Held: false, Figure: "first request: " + describe(a)}, nil
	}
	start := time.Now()
	_ = c.c.SetReadDeadline(start.Add(10 * time.Second))
	_, err = c.br.ReadByte() // returns when kvroute closes the connection
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return Result{Held: false, Figure: "idle connection still open after 10 s (timeouts.client_idle 1s)"}, nil
	}
	return Result{Held: took < 5*time.Second, Figure: fmt.Sprintf("idle kept-alive connection closed after %.1f s (timeouts.client_idle 1s)", took.Seconds())}, nil
}
