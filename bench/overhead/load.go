package overhead

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// loadSpec is one closed-loop run against one address.
type loadSpec struct {
	addr        string // host:port
	scenario    string
	concurrency int
	run         int // salts the generated text
	warmup      time.Duration
	duration    time.Duration
	events      int // events per streamed response
	opts        *Options
	// atStart and atEnd, when set, are called at the start and end of the
	// measured window (to sample CPU time).
	atStart, atEnd func()
}

// loadResult is what a run measured. Only requests that both started and
// completed inside the measured window count; errors count throughout.
type loadResult struct {
	Requests  int64
	Errors    int64
	FirstErr  string
	Seconds   float64 // the measured window
	Latency   []int64 // per request, ns
	Events    []int64 // per streamed event arrived inside the window (of a stream that completed), arrival − emission, ns
	BodyBytes int64   // request bytes sent, counted requests
}

// drive runs s: s.concurrency connections, each sending its next request as
// soon as the last completed, for s.warmup then s.duration.
func drive(ctx context.Context, s loadSpec) (*loadResult, error) {
	stream := isStream(s.scenario)
	hc := &fasthttp.HostClient{
		Addr:                     s.addr,
		MaxConns:                 s.concurrency,
		MaxConnWaitTimeout:       30 * time.Second,
		ReadTimeout:              30 * time.Second,
		WriteTimeout:             30 * time.Second,
		MaxIdleConnDuration:      time.Minute,
		MaxResponseBodySize:      16 << 20,
		NoDefaultUserAgentHeader: true,
		StreamResponseBody:       stream,
	}
	defer hc.CloseIdleConnections()

	spread := s.startSpread()
	start := time.Now()
	t0 := start.Add(spread + s.warmup)
	t1 := t0.Add(s.duration)
	workers := make([]*worker, s.concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{spec: &s, hc: hc, gen: newBodyGen(s.scenario, s.run, i, s.opts), t0: t0, t1: t1}
		workers[i] = w
		delay := time.Duration(int64(spread) * int64(i) / int64(s.concurrency))
		wg.Go(func() {
			if delay > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(delay):
				}
			}
			w.loop(ctx, stream)
		})
	}
	sampler := make(chan struct{})
	gcOn := func() {}
	defer func() { gcOn() }()
	go func() {
		defer close(sampler)
		for _, at := range []struct {
			t time.Time
			f func()
		}{{t0.Add(-s.warmup / 2), func() { gcOn = pauseGC() }}, {t0, s.atStart}, {t1, s.atEnd}} {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Until(at.t)):
			}
			if at.f != nil {
				at.f()
			}
		}
	}()
	wg.Wait()
	<-sampler

	res := &loadResult{Seconds: s.duration.Seconds()}
	for _, w := range workers {
		res.Requests += int64(len(w.latency))
		res.Errors += w.errors
		if res.FirstErr == "" {
			res.FirstErr = w.firstErr
		}
		res.Latency = append(res.Latency, w.latency...)
		res.Events = append(res.Events, w.events...)
		res.BodyBytes += w.bodyBytes
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// startSpread is how long the first requests of s's connections are
// spread over, the i-th starting at i/concurrency of it: zero but for
// manystreams (Options.ManyStreamsSpread), whose streams of independent
// users start, and so end, at any moment. The warm-up starts once the
// last has started.
func (s *loadSpec) startSpread() time.Duration {
	if s.scenario != ScenarioManyStreams {
		return 0
	}
	return s.opts.ManyStreamsSpread
}

// pauseGC collects the driver's garbage and turns its collector off until
// the function it returns is called, so that the measured window is free of
// the driver's own collections: their mark phase shares the driver's CPU
// with the upstreams and the load generator and delays events by tens of
// milliseconds in whichever run it falls. A memory limit of what is live
// now plus maxPausedGrowth still collects if a run would outgrow it.
func pauseGC() (restore func()) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	limit := debug.SetMemoryLimit(int64(ms.HeapSys) + maxPausedGrowth)
	pct := debug.SetGCPercent(-1)
	return func() {
		debug.SetGCPercent(pct)
		debug.SetMemoryLimit(limit)
	}
}

// maxPausedGrowth bounds the heap's growth while pauseGC holds the driver's
// collector off: 1 GiB, some 20 times what a 5 s run of a thousand streams
// allocates.
const maxPausedGrowth = 1 << 30

// worker is one connection of the closed loop.
type worker struct {
	spec      *loadSpec
	hc        *fasthttp.HostClient
	gen       bodyGen
	t0, t1    time.Time
	latency   []int64
	events    []int64
	pending   []int64 // the current stream's event latencies
	bodyBytes int64
	errors    int64
	firstErr  string
	br        *bufio.Reader
}

func (w *worker) fail(err error) {
	w.errors++
	if w.firstErr == "" {
		w.firstErr = err.Error()
	}
}

func (w *worker) loop(ctx context.Context, stream bool) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + w.spec.addr + "/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	for ctx.Err() == nil {
		body := w.gen.next()
		req.SetBodyRaw(body)
		w.pending = w.pending[:0]
		start := time.Now()
		err := w.hc.Do(req, resp)
		if err == nil {
			if stream {
				err = w.readStream(resp)
			} else {
				err = checkResponse(resp)
			}
		}
		end := time.Now()
		w.gen.answered(err == nil)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.fail(err)
			// Don't spin on a router that is down.
			time.Sleep(10 * time.Millisecond)
		} else {
			// A stream's events count by arrival (readStream), so that
			// streams longer than the window are measured too.
			w.events = append(w.events, w.pending...)
			if !start.Before(w.t0) && !end.After(w.t1) {
				w.latency = append(w.latency, int64(end.Sub(start)))
				w.bodyBytes += int64(len(body))
			}
		}
		if !end.Before(w.t1) {
			return
		}
	}
}

var (
	choicesKey = []byte(`"choices"`)
	dataPrefix = []byte("data: ")
	doneData   = []byte("[DONE]")
	tKey       = []byte(`"t":`)
)

// checkResponse accepts a 200 chat completion.
func checkResponse(resp *fasthttp.Response) error {
	if sc := resp.StatusCode(); sc != fasthttp.StatusOK {
		return fmt.Errorf("status %d: %.200s", sc, resp.Body())
	}
	if !bytes.Contains(resp.Body(), choicesKey) {
		return fmt.Errorf("not a chat completion: %.200s", resp.Body())
	}
	return nil
}

// readStream reads a streamed response to its end, noting each event's
// arrival − emission in w.pending, and checks that every event and the
// final [DONE] arrived.
func (w *worker) readStream(resp *fasthttp.Response) error {
	body := resp.BodyStream()
	if body == nil {
		return checkResponse(resp)
	}
	defer func() { _ = resp.CloseBodyStream() }()
	if sc := resp.StatusCode(); sc != fasthttp.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(body, 512))
		return fmt.Errorf("status %d: %s", sc, b)
	}
	if w.br == nil {
		w.br = bufio.NewReaderSize(body, 16<<10)
	} else {
		w.br.Reset(body)
	}
	done, events := false, 0
	t0, t1 := w.t0.UnixNano(), w.t1.UnixNano()
	for {
		line, err := w.br.ReadSlice('\n')
		if len(line) > 0 && bytes.HasPrefix(line, dataPrefix) {
			now := time.Now().UnixNano()
			data := bytes.TrimSpace(line[len(dataPrefix):])
			switch {
			case bytes.Equal(data, doneData):
				done = true
			default:
				i := bytes.LastIndex(data, tKey)
				if i < 0 {
					return fmt.Errorf("event without a timestamp: %.200s", data)
				}
				t, ok := parseStamp(data[i+len(tKey):])
				if !ok {
					return fmt.Errorf("event timestamp in %.200s", data)
				}
				events++
				if now >= t0 && now <= t1 {
					w.pending = append(w.pending, now-t)
				}
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if !done || events != w.spec.events {
		return fmt.Errorf("stream ended after %d of %d events (done %v)", events, w.spec.events, done)
	}
	return nil
}

// parseStamp parses the decimal digits that start b, followed by "}".
func parseStamp(b []byte) (int64, bool) {
	var t int64
	n := 0
	for ; n < len(b) && b[n] >= '0' && b[n] <= '9'; n++ {
		t = t*10 + int64(b[n]-'0')
	}
	return t, n > 0 && n < 20 && n < len(b) && b[n] == '}'
}
