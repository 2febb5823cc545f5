package backends

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// fakeReplica is an engine stand-in on 127.0.0.1 whose answers tests change
// at will.
type fakeReplica struct {
	srv *httptest.Server

	healthCode  atomic.Int32
	healthDelay atomic.Int64 // ns
	metricsCode atomic.Int32
	metrics     atomic.Pointer[string]
	modelsCode  atomic.Int32
	models      atomic.Pointer[string]

	healthHits, metricsHits, modelsHits atomic.Int64

	// released, closed by release, ends every delayed health answer.
	released    chan struct{}
	releaseOnce sync.Once
}

// release ends the health answers being delayed and delays no later one,
// so that a fleet's loops can stop.
func (f *fakeReplica) release() {
	f.healthDelay.Store(0)
	f.releaseOnce.Do(func() { close(f.released) })
}

func newFakeReplica(t *testing.T, metricsBody string) *fakeReplica {
	t.Helper()
	return startFakeReplica(t, metricsBody, false)
}

func startFakeReplica(t *testing.T, metricsBody string, useTLS bool) *fakeReplica {
	t.Helper()
	f := &fakeReplica{released: make(chan struct{})}
	f.healthCode.Store(http.StatusOK)
	f.metricsCode.Store(http.StatusOK)
	f.modelsCode.Store(http.StatusOK)
	f.setMetrics(metricsBody)
	f.setModels(`{"object":"list","data":[{"id":"m1","object":"model"}]}`)

	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	_ = f.srv.Listener.Close()
	f.srv.Listener = ln
	if useTLS {
		f.srv.StartTLS()
	} else {
		f.srv.Start()
	}
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeReplica) setMetrics(s string) { f.metrics.Store(&s) }
func (f *fakeReplica) setModels(s string)  { f.models.Store(&s) }
func (f *fakeReplica) url() string         { return f.srv.URL }

func (f *fakeReplica) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
		f.healthHits.Add(1)
		if d := time.Duration(f.healthDelay.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-f.released:
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(int(f.healthCode.Load()))
	case "/metrics":
		f.metricsHits.Add(1)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.WriteHeader(int(f.metricsCode.Load()))
		_, _ = w.Write([]byte(*f.metrics.Load()))
	case "/v1/models":
		f.modelsHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(int(f.modelsCode.Load()))
		_, _ = w.Write([]byte(*f.models.Load()))
	default:
		http.NotFound(w, r)
	}
}

// closedURL returns an http URL on 127.0.0.1 where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

const vllmMinimal = "vllm:num_requests_waiting 5\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"

// fastOptions make background loops tick quickly.
var fastOptions = Options{
	HealthInterval:  15 * time.Millisecond,
	HealthTimeout:   500 * time.Millisecond,
	MetricsInterval: 10 * time.Millisecond,
	MetricsTimeout:  500 * time.Millisecond,
}

func newTestFleet(t *testing.T, specs []Spec, opts Options) *Fleet {
	t.Helper()
	f, err := NewFleet(specs, opts, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.stopAllForTest() })
	return f
}

// stopAllForTest retires every replica, so no loop outlives its test.
func (f *Fleet) stopAllForTest() {
	for _, r := range f.Replicas() {
		r.retire()
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestNewFleetValidation(t *testing.T) {
	ok := Spec{Name: "a", URL: "http://127.0.0.1:8000", Engine: EngineVLLM}
	with := func(mod func(*Spec)) []Spec {
		s := ok
		mod(&s)
		return []Spec{s}
	}
	tests := []struct {
		name    string
		specs   []Spec
		opts    Options
		wantErr string
	}{
		{name: "ok", specs: []Spec{ok}},
		{name: "empty fleet", specs: nil},
		{name: "https default port", specs: with(func(s *Spec) { s.URL = "https://vllm.internal" })},
		{name: "trailing slash", specs: with(func(s *Spec) { s.URL = "http://127.0.0.1:8000/" })},
		{name: "ipv6", specs: with(func(s *Spec) { s.URL = "http://[::1]:8000" })},
		{name: "empty name", specs: with(func(s *Spec) { s.Name = "" }), wantErr: "name is empty"},
		{name: "duplicate", specs: []Spec{ok, ok}, wantErr: "duplicate"},
		{name: "empty url", specs: with(func(s *Spec) { s.URL = "" }), wantErr: "URL is empty"},
		{name: "scheme", specs: with(func(s *Spec) { s.URL = "ftp://h:1" }), wantErr: "scheme"},
		{name: "no scheme", specs: with(func(s *Spec) { s.URL = "127.0.0.1:8000" }), wantErr: "URL"},
		{name: "base path", specs: with(func(s *Spec) { s.URL = "http://h:1/engine-a/" })},
		{name: "fragment", specs: with(func(s *Spec) { s.URL = "http://h:1/x#y" }), wantErr: "only scheme"},
		{name: "query", specs: with(func(s *Spec) { s.URL = "http://h:1?x=1" }), wantErr: "only scheme"},
		{name: "user", specs: with(func(s *Spec) { s.URL = "http://u:p@h:1" }), wantErr: "only scheme"},
		{name: "bad port", specs: with(func(s *Spec) { s.URL = "http://h:0" }), wantErr: "port"},
		{name: "empty port", specs: with(func(s *Spec) { s.URL = "http://h:" }), wantErr: "port"},
		{name: "no host", specs: with(func(s *Spec) { s.URL = "http://:80" }), wantErr: "host"},
		{name: "engine", specs: with(func(s *Spec) { s.Engine = "tgi" }), wantErr: "unknown engine"},
		{name: "no engine", specs: with(func(s *Spec) { s.Engine = "" }), wantErr: "unknown engine"},
		{name: "empty model", specs: with(func(s *Spec) { s.Models = []string{""} }), wantErr: "empty model"},
		{name: "negative option", specs: []Spec{ok}, opts: Options{HealthTimeout: -1}, wantErr: "HealthTimeout"},
		{name: "negative threshold", specs: []Spec{ok}, opts: Options{FailThreshold: -1}, wantErr: "FailThreshold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := NewFleet(tt.specs, tt.opts, nil)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if got := len(f.Replicas()); got != len(tt.specs) {
					t.Fatalf("%d replicas, want %d", got, len(tt.specs))
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if vErr := ValidateSpecs(tt.specs); reflect.DeepEqual(tt.opts, Options{}) && vErr == nil {
				t.Fatalf("ValidateSpecs accepted what NewFleet rejected")
			}
		})
	}
}

func TestOptionsDefaults(t *testing.T) {
	tests := []struct {
		in        Options
		wantStale time.Duration
	}{
		{Options{}, time.Second},
		{Options{MetricsInterval: time.Second}, 4 * time.Second},
		{Options{MetricsInterval: 10 * time.Millisecond}, time.Second},
		{Options{StaleAfter: 300 * time.Millisecond}, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		o, err := tt.in.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if o.StaleAfter != tt.wantStale {
			t.Errorf("%+v: StaleAfter %v, want %v", tt.in, o.StaleAfter, tt.wantStale)
		}
	}
	o, _ := Options{}.withDefaults()
	want := Options{
		HealthInterval: 2 * time.Second, HealthTimeout: time.Second,
		MetricsInterval: 250 * time.Millisecond, MetricsTimeout: time.Second,
		StaleAfter: time.Second, FailThreshold: 3, ConnectTimeout: 2 * time.Second,
		MaxConnsPerReplica: 1024, MaxConnWaitTimeout: 0,
	}
	if !reflect.DeepEqual(o, want) {
		t.Errorf("defaults %+v, want %+v", o, want)
	}
}

func TestClientConfig(t *testing.T) {
	f := newTestFleet(t, []Spec{
		{Name: "a", URL: "http://127.0.0.1:8000", Engine: EngineVLLM},
		{Name: "b", URL: "https://Example.internal", Engine: EngineSGLang},
	}, Options{MaxConnsPerReplica: 7, MaxConnWaitTimeout: 50 * time.Millisecond})
	a, b := f.ByName("a").Client(), f.ByName("b").Client()
	if a.Addr != "127.0.0.1:8000" || a.IsTLS {
		t.Errorf("a: Addr %q IsTLS %v", a.Addr, a.IsTLS)
	}
	if b.Addr != "example.internal:443" || !b.IsTLS {
		t.Errorf("b: Addr %q IsTLS %v", b.Addr, b.IsTLS)
	}
	if a.MaxConns != 7 || a.MaxConnWaitTimeout != 50*time.Millisecond || a.MaxIdemponentCallAttempts != 1+staleRetries ||
		a.ReadTimeout != 0 || a.WriteTimeout != 0 || !a.DisableHeaderNamesNormalizing ||
		!a.DisablePathNormalizing || !a.StreamResponseBody || a.DialTimeout == nil || a.RetryIfErr == nil {
		t.Errorf("proxy client misconfigured: %+v", a)
	}
	if f.ByName("a").Client() != a {
		t.Error("Client() is not the same pooled client on every call")
	}
}

func TestCustomDial(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	var dials atomic.Int64
	d := &net.Dialer{Timeout: time.Second}
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}, Options{
		Dial: func(addr string) (net.Conn, error) {
			dials.Add(1)
			return d.Dial("tcp4", addr)
		},
	})
	f.CheckNow(context.Background())
	if n := dials.Load(); n != 0 {
		t.Fatalf("checks used Options.Dial (%d dials)", n)
	}
	r := f.ByName("a")
	if !r.Healthy() || r.Snapshot() == nil {
		t.Fatal("checks failed")
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(fake.url() + "/v1/models")
	if err := r.Client().Do(req, resp); err != nil || resp.StatusCode() != http.StatusOK {
		t.Fatalf("proxy client: %v %d", err, resp.StatusCode())
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("proxy client dialled %d times through Options.Dial, want 1", n)
	}
}

func TestConnectTimeoutCoversTLSHandshake(t *testing.T) {
	// A TCP listener that accepts and never answers: the TLS handshake hangs.
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	}()

	f := newTestFleet(t, []Spec{{Name: "a", URL: "https://" + ln.Addr().String(), Engine: EngineVLLM}},
		Options{ConnectTimeout: 150 * time.Millisecond})
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("https://" + ln.Addr().String() + "/v1/models")
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- f.ByName("a").Client().Do(req, resp) }() // no request timeout at all
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("request to a silent TLS peer succeeded")
		}
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Errorf("failed after %v, before the connect timeout: %v", d, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("TLS handshake not bounded by ConnectTimeout")
	}
}

func TestAcquireRelease(t *testing.T) {
	f := newTestFleet(t, []Spec{{Name: "a", URL: "http://127.0.0.1:1", Engine: EngineVLLM}}, Options{})
	r := f.ByName("a")

	rel1 := r.Acquire()
	rel2 := r.Acquire()
	if r.InFlight() != 2 || r.Dispatched() != 2 {
		t.Fatalf("in-flight %d dispatched %d, want 2 2", r.InFlight(), r.Dispatched())
	}
	rel1()
	rel1()
	if r.InFlight() != 1 {
		t.Fatalf("in-flight %d after double release, want 1", r.InFlight())
	}
	rel2()
	if r.InFlight() != 0 || r.Dispatched() != 2 {
		t.Fatalf("in-flight %d dispatched %d, want 0 2", r.InFlight(), r.Dispatched())
	}

	// Concurrent acquires, each released from two goroutines at once.
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 100 {
				rel := r.Acquire()
				var inner sync.WaitGroup
				inner.Go(rel)
				inner.Go(rel)
				inner.Wait()
			}
		})
	}
	wg.Wait()
	if r.InFlight() != 0 || r.Dispatched() != 2+64*100 {
		t.Fatalf("in-flight %d dispatched %d", r.InFlight(), r.Dispatched())
	}

	allocs := testing.AllocsPerRun(1000, func() { r.Acquire()() })
	if allocs > 2 {
		t.Errorf("Acquire+release allocates %v times, budget 2", allocs)
	}
}

func TestPassiveEjection(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	core, logs := observer.New(zapcore.InfoLevel)
	f, err := NewFleet([]Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}, Options{FailThreshold: 3}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	r := f.ByName("a")
	boom := errors.New("connection reset")

	steps := []struct {
		op          string // fail, ok, check
		wantHealthy bool
	}{
		{"fail", true}, {"fail", true}, {"ok", true}, // success resets the streak
		{"fail", true}, {"fail", true}, {"fail", false}, // third consecutive: ejected
		{"fail", false},
		{"ok", false},   // a passive success does not un-eject
		{"check", true}, // a passing active check does
		{"fail", true},  // and the streak starts over
	}
	for i, st := range steps {
		switch st.op {
		case "fail":
			r.ReportFailure(boom)
		case "ok":
			r.ReportSuccess()
		case "check":
			f.CheckNow(context.Background())
		}
		if r.Healthy() != st.wantHealthy {
			t.Fatalf("step %d (%s): Healthy %v, want %v", i, st.op, r.Healthy(), st.wantHealthy)
		}
	}
	if r.LastError() != "connection reset" {
		t.Errorf("LastError %q", r.LastError())
	}
	if n := logs.FilterMessage("replica ejected").FilterLevelExact(zapcore.WarnLevel).Len(); n != 1 {
		t.Errorf("%d ejection warnings, want 1", n)
	}
	if n := logs.FilterMessage("replica back in service").Len(); n != 1 {
		t.Errorf("%d recovery logs, want 1", n)
	}
	r.ReportFailure(nil) // must not panic
}

// A replica whose health endpoint answers while its requests fail (an
// engine that serves GET /health but answers every completion 500) is
// ejected: a passing check between two failed requests does not break
// their streak, and a failed check does not add to it.
func TestPassingChecksDoNotBreakAFailingStreak(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}},
		Options{HealthTimeout: 100 * time.Millisecond, FailThreshold: 2})
	r := f.ByName("a")
	ctx := context.Background()
	boom := errors.New("status 500")

	r.ReportFailure(boom)
	f.CheckNow(ctx) // passes
	if !r.Healthy() || r.ConsecutiveFailures() != 1 {
		t.Fatalf("after a failed request and a passing check: healthy %v, streak %d; want healthy, 1", r.Healthy(), r.ConsecutiveFailures())
	}
	r.ReportFailure(boom)
	if r.Healthy() {
		t.Fatal("not ejected after two failed requests with a passing check between them")
	}
	f.CheckNow(ctx) // back in service, the streak started over
	if !r.Healthy() || r.ConsecutiveFailures() != 0 {
		t.Fatalf("after a passing check: healthy %v, streak %d; want back, 0", r.Healthy(), r.ConsecutiveFailures())
	}

	// One failed check and one failed request are two streaks of one.
	fake.healthCode.Store(http.StatusInternalServerError)
	f.CheckNow(ctx)
	r.ReportFailure(boom)
	if !r.Healthy() {
		t.Fatal("ejected by one failed check and one failed request, threshold 2")
	}
	r.ReportSuccess() // a served request ends the requests' streak only
	f.CheckNow(ctx)
	if r.Healthy() {
		t.Fatal("not ejected after two failed checks with a served request between them")
	}
}

func TestActiveHealth(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(*fakeReplica)
		fixIt   func(*fakeReplica)
		wantErr string
	}{
		{
			name:    "500 on /health",
			breakIt: func(f *fakeReplica) { f.healthCode.Store(http.StatusInternalServerError) },
			fixIt:   func(f *fakeReplica) { f.healthCode.Store(http.StatusOK) },
			wantErr: "status 500",
		},
		{
			name:    "503 while loading",
			breakIt: func(f *fakeReplica) { f.healthCode.Store(http.StatusServiceUnavailable) },
			fixIt:   func(f *fakeReplica) { f.healthCode.Store(http.StatusOK) },
			wantErr: "status 503",
		},
		{
			name:    "hangs past the timeout",
			breakIt: func(f *fakeReplica) { f.healthDelay.Store(int64(time.Second)) },
			fixIt:   func(f *fakeReplica) { f.healthDelay.Store(0) },
			wantErr: "timeout",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeReplica(t, vllmMinimal)
			f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}},
				Options{HealthTimeout: 100 * time.Millisecond, FailThreshold: 2})
			r := f.ByName("a")
			ctx := context.Background()

			if !r.Healthy() {
				t.Fatal("replicas must start healthy")
			}
			f.CheckNow(ctx)
			if !r.Healthy() || r.ConsecutiveFailures() != 0 {
				t.Fatal("healthy replica not healthy after a check")
			}
			tt.breakIt(fake)
			f.CheckNow(ctx)
			if !r.Healthy() {
				t.Fatal("ejected after one failure, threshold 2")
			}
			f.CheckNow(ctx)
			if r.Healthy() {
				t.Fatal("not ejected after two failed checks")
			}
			if !strings.Contains(r.LastError(), tt.wantErr) {
				t.Errorf("LastError %q, want it to contain %q", r.LastError(), tt.wantErr)
			}
			tt.fixIt(fake)
			f.CheckNow(ctx)
			if !r.Healthy() || r.ConsecutiveFailures() != 0 {
				t.Fatal("not back in service after a passing check")
			}
		})
	}
}

func TestHTTPS(t *testing.T) {
	fake := startFakeReplica(t, vllmMinimal, true)
	pool := x509.NewCertPool()
	pool.AddCert(fake.srv.Certificate())
	spec := []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}
	if !strings.HasPrefix(fake.url(), "https://127.0.0.1:") {
		t.Fatalf("fake URL %s", fake.url())
	}

	trusted := newTestFleet(t, spec, Options{TLSConfig: &tls.Config{RootCAs: pool}})
	trusted.CheckNow(context.Background())
	r := trusted.ByName("a")
	if !r.Healthy() || r.Snapshot() == nil || !slices.Equal(r.Models(), []string{"m1"}) {
		t.Fatalf("https replica: healthy %v snapshot %v models %v err %q", r.Healthy(), r.Snapshot(), r.Models(), r.LastError())
	}
	// The proxy client speaks TLS too.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(fake.url() + "/health")
	if err := r.Client().DoTimeout(req, resp, time.Second); err != nil || resp.StatusCode() != http.StatusOK {
		t.Fatalf("proxy client over TLS: %v %d", err, resp.StatusCode())
	}

	// Without the test CA the handshake fails and counts as a failure.
	untrusted := newTestFleet(t, spec, Options{FailThreshold: 1})
	untrusted.CheckNow(context.Background())
	if u := untrusted.ByName("a"); u.Healthy() || !strings.Contains(u.LastError(), "certificate") {
		t.Fatalf("untrusted https replica: healthy %v err %q", u.Healthy(), u.LastError())
	}
}

func TestUnreachableReplica(t *testing.T) {
	f := newTestFleet(t, []Spec{{Name: "a", URL: closedURL(t), Engine: EngineVLLM}}, Options{FailThreshold: 1})
	r := f.ByName("a")
	f.CheckNow(context.Background())
	if r.Healthy() {
		t.Fatal("unreachable replica still healthy")
	}
	if r.Snapshot() != nil || r.Models() != nil {
		t.Fatal("unreachable replica has a snapshot or models")
	}
}

func TestModels(t *testing.T) {
	static := newFakeReplica(t, vllmMinimal)
	fetch := newFakeReplica(t, vllmMinimal)
	fetch.setModels(`{"object":"list","data":[{"id":"m2","object":"model"},{"id":"m1"},{"id":"m2"},{"object":"no id"}]}`)
	none := newFakeReplica(t, vllmMinimal)
	none.modelsCode.Store(http.StatusNotFound)

	f := newTestFleet(t, []Spec{
		{Name: "static", URL: static.url(), Engine: EngineVLLM, Models: []string{"ms", "m1"}},
		{Name: "fetch", URL: fetch.url(), Engine: EngineVLLM},
		{Name: "none", URL: none.url(), Engine: EngineVLLM},
	}, Options{})
	rs, rf, rn := f.ByName("static"), f.ByName("fetch"), f.ByName("none")

	if rf.Models() != nil || !rf.Serves("anything") {
		t.Fatal("before the first fetch: want no models and Serves everything")
	}
	if got := f.Models(); !slices.Equal(got, []string{"m1", "ms"}) {
		t.Fatalf("fleet models before fetch %v", got)
	}
	f.CheckNow(context.Background())

	if got := rf.Models(); !slices.Equal(got, []string{"m2", "m1"}) {
		t.Errorf("fetched models %v", got)
	}
	if static.modelsHits.Load() != 0 {
		t.Error("static replica was asked for /v1/models")
	}
	if got := f.Models(); !slices.Equal(got, []string{"m1", "m2", "ms"}) {
		t.Errorf("fleet models %v", got)
	}
	serves := []struct {
		r     *Replica
		model string
		want  bool
	}{
		{rs, "ms", true}, {rs, "m1", true}, {rs, "m2", false},
		{rf, "m1", true}, {rf, "m2", true}, {rf, "ms", false}, {rf, "", false},
		{rn, "anything", true}, // no known models: cannot exclude
	}
	for _, s := range serves {
		if got := s.r.Serves(s.model); got != s.want {
			t.Errorf("%s.Serves(%q) = %v, want %v", s.r.Name(), s.model, got, s.want)
		}
	}

	// A bad or empty answer keeps the last good list; a new list replaces it.
	for _, body := range []string{`not json`, `{"data":{}}`, `{"data":[]}`} {
		fetch.setModels(body)
		f.CheckNow(context.Background())
		if got := rf.Models(); !slices.Equal(got, []string{"m2", "m1"}) {
			t.Errorf("after %q: models %v, want the last good list", body, got)
		}
		if !rf.Healthy() {
			t.Error("a bad model list made the replica unhealthy")
		}
	}
	fetch.setModels(`{"data":[{"id":"m3"}]}`)
	f.CheckNow(context.Background())
	if got := rf.Models(); !slices.Equal(got, []string{"m3"}) {
		t.Errorf("models %v, want [m3]", got)
	}
	// The Spec is copied: mutating the caller's slice changes nothing.
	spec := rs.Spec()
	spec.Models[0] = "mutated"
	if rs.Models()[0] != "ms" {
		t.Error("Spec() exposed internal state")
	}
}

func TestMetricsSnapshot(t *testing.T) {
	fake := newFakeReplica(t, string(readTestdata(t, "sglang.txt")))
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineSGLang}}, Options{StaleAfter: time.Minute})
	r := f.ByName("a")
	if r.Snapshot() != nil || r.Fresh(time.Now()) {
		t.Fatal("snapshot before the first poll")
	}
	rel := r.Acquire()
	r.Acquire()()
	r.Acquire()()
	before := time.Now()
	f.CheckNow(context.Background())
	s := r.Snapshot()
	if s == nil {
		t.Fatal("no snapshot after CheckNow")
	}
	if s.Waiting != 2826 || s.Running != 162 || s.KVCapacityTokens != 442368 {
		t.Errorf("snapshot %+v", s)
	}
	if s.InFlightAtScrape != 1 || s.DispatchedAtScrape != 3 {
		t.Errorf("router counters at scrape %d/%d, want 1/3", s.InFlightAtScrape, s.DispatchedAtScrape)
	}
	if s.At.Before(before) || s.At.After(time.Now()) {
		t.Errorf("At %v not within the poll", s.At)
	}
	rel()

	// A newer poll publishes a new snapshot, never mutating the old one.
	fake.setMetrics("sglang:num_queue_reqs 1\n")
	f.CheckNow(context.Background())
	if s2 := r.Snapshot(); s2 == s || s2.Waiting != 1 || s.Waiting != 2826 {
		t.Errorf("old %+v new %+v", s, s2)
	}
}

func TestSnapshotStaleness(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}, Options{StaleAfter: 2 * time.Second})
	r := f.ByName("a")
	f.CheckNow(context.Background())
	s := r.Snapshot()
	if s == nil {
		t.Fatal("no snapshot")
	}
	tests := []struct {
		at   time.Time
		want bool
	}{
		{s.At, true},
		{s.At.Add(time.Second), true},
		{s.At.Add(2 * time.Second), true},
		{s.At.Add(2*time.Second + time.Nanosecond), false},
		{s.At.Add(time.Hour), false},
	}
	for _, tt := range tests {
		if got := r.Fresh(tt.at); got != tt.want {
			t.Errorf("Fresh(At+%v) = %v, want %v", tt.at.Sub(s.At), got, tt.want)
		}
	}
}

func TestBadMetricsStayHealthy(t *testing.T) {
	tests := []struct {
		name   string
		code   int
		body   string
		engine Engine
	}{
		{"garbage", http.StatusOK, "this is not prometheus {{{", EngineVLLM},
		{"404", http.StatusNotFound, "404 page not found", EngineVLLM},
		{"500", http.StatusInternalServerError, "", EngineSGLang},
		{"wrong engine", http.StatusOK, vllmMinimal, EngineSGLang},
		{"empty", http.StatusOK, "", EngineVLLM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := newFakeReplica(t, tt.body)
			fake.metricsCode.Store(int32(tt.code))
			core, logs := observer.New(zapcore.DebugLevel)
			f, err := NewFleet([]Spec{{Name: "a", URL: fake.url(), Engine: tt.engine}},
				func() Options { o := fastOptions; o.FailThreshold = 1; return o }(), zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(f.stopAllForTest)
			r := f.ByName("a")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			f.Start(ctx)
			eventually(t, "20 metrics polls", func() bool { return fake.metricsHits.Load() >= 20 })
			eventually(t, "a health check", func() bool { return fake.healthHits.Load() >= 1 })
			if !r.Healthy() || r.ConsecutiveFailures() != 0 || r.LastError() != "" {
				t.Fatalf("bad metrics affected health: healthy %v failures %d err %q",
					r.Healthy(), r.ConsecutiveFailures(), r.LastError())
			}
			if r.Snapshot() != nil || r.Fresh(time.Now()) {
				t.Fatal("snapshot published from bad metrics")
			}
			if n := logs.FilterMessage("metrics poll failed").Len(); n != 1 {
				t.Errorf("%d metrics failure logs in 20 polls, want 1 (rate-limited)", n)
			}

			// Once /metrics is fixed, snapshots flow.
			fake.metricsCode.Store(http.StatusOK)
			if tt.engine == EngineVLLM {
				fake.setMetrics(vllmMinimal)
			} else {
				fake.setMetrics("sglang:num_queue_reqs 5\n")
			}
			eventually(t, "a snapshot", func() bool { return r.Fresh(time.Now()) })
			if s := r.Snapshot(); s.Waiting != 5 {
				t.Errorf("snapshot %+v", s)
			}
			eventually(t, "the recovery log", func() bool { return logs.FilterMessage("metrics poll recovered").Len() == 1 })
		})
	}
}

func TestStartLoopsAndCancel(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}, fastOptions)
	r := f.ByName("a")
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx)
	f.Start(ctx) // second Start is a no-op
	eventually(t, "health, models and metrics polls", func() bool {
		return fake.healthHits.Load() >= 3 && fake.modelsHits.Load() >= 3 && fake.metricsHits.Load() >= 3
	})
	eventually(t, "models", func() bool { return slices.Equal(r.Models(), []string{"m1"}) })

	// A failing /health ejects, a passing one restores, all by the loop.
	fake.healthCode.Store(http.StatusInternalServerError)
	eventually(t, "ejection", func() bool { return !r.Healthy() })
	fake.healthCode.Store(http.StatusOK)
	eventually(t, "recovery", func() bool { return r.Healthy() })

	cancel()
	r.loops.Wait()
	h, m := fake.healthHits.Load(), fake.metricsHits.Load()
	time.Sleep(60 * time.Millisecond)
	if fake.healthHits.Load() != h || fake.metricsHits.Load() != m {
		t.Fatal("loops still polling after ctx was cancelled")
	}
}

func TestLoopRecoversPanic(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	f, err := NewFleet([]Spec{{Name: "a", URL: "http://127.0.0.1:1", Engine: EngineVLLM}}, Options{}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	r := f.ByName("a")
	ctx, cancel := context.WithCancel(context.Background())
	var rounds atomic.Int64
	r.loops.Add(1)
	go r.loop(ctx, "test", time.Millisecond, func() {
		if rounds.Add(1) <= 2 {
			panic("boom")
		}
	})
	eventually(t, "rounds after panics", func() bool { return rounds.Load() >= 5 })
	cancel()
	r.loops.Wait()
	if n := logs.FilterMessage("panic in background check").Len(); n != 2 {
		t.Errorf("%d panic logs, want 2", n)
	}
}

func TestUpdate(t *testing.T) {
	fa, fb, fc, fd := newFakeReplica(t, vllmMinimal), newFakeReplica(t, vllmMinimal),
		newFakeReplica(t, vllmMinimal), newFakeReplica(t, vllmMinimal)
	f := newTestFleet(t, []Spec{
		{Name: "a", URL: fa.url(), Engine: EngineVLLM},
		{Name: "b", URL: fb.url(), Engine: EngineVLLM},
	}, fastOptions)
	a, b := f.ByName("a"), f.ByName("b")
	if a.ID() != 0 || b.ID() != 1 {
		t.Fatalf("IDs %d %d", a.ID(), b.ID())
	}

	// State before the reload: a ejected with a request in flight and a
	// snapshot.
	f.CheckNow(context.Background())
	snap := a.Snapshot()
	release := a.Acquire()
	for range 3 {
		a.ReportFailure(errors.New("reset"))
	}
	if a.Healthy() || snap == nil {
		t.Fatal("setup failed")
	}

	// a kept (URL spelled differently but the same address), b moves to
	// another URL (removed and re-added), c is new.
	sameA := fa.url() + "/"
	added, removed, err := f.Update([]Spec{
		{Name: "c", URL: fc.url(), Engine: EngineVLLM},
		{Name: "a", URL: sameA, Engine: EngineSGLang, Models: []string{"x"}},
		{Name: "b", URL: fd.url(), Engine: EngineVLLM},
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.ByName("a") != a || a.Healthy() || a.InFlight() != 1 || a.Dispatched() != 1 || a.Snapshot() != snap || a.ID() != 0 {
		t.Fatalf("a lost its state: healthy %v in-flight %d snapshot %p", a.Healthy(), a.InFlight(), a.Snapshot())
	}
	if a.Spec().Engine != EngineSGLang || !slices.Equal(a.Models(), []string{"x"}) {
		t.Errorf("a's spec not updated: %+v", a.Spec())
	}
	if len(removed) != 1 || removed[0] != b {
		t.Fatalf("removed %v", names(removed))
	}
	if got := names(added); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("added %v", got)
	}
	c, b2 := f.ByName("c"), f.ByName("b")
	if got := names(f.Replicas()); !slices.Equal(got, []string{"c", "a", "b"}) {
		t.Fatalf("order %v", got)
	}
	// The ID freed by b is not reused in the same Update.
	if c.ID() != 2 || b2.ID() != 3 {
		t.Errorf("new IDs %d %d, want 2 3", c.ID(), b2.ID())
	}
	release()
	if a.InFlight() != 0 {
		t.Fatal("release after reload did not reach the kept replica")
	}

	// Start now: loops run for current replicas only.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx)
	eventually(t, "polls of c and the new b", func() bool {
		return fc.metricsHits.Load() > 0 && fd.metricsHits.Load() > 0 && fa.metricsHits.Load() > 1
	})
	eventually(t, "a back in service via its loop", a.Healthy)
	if n := fb.healthHits.Load(); n != 1 { // only the CheckNow before Start
		t.Errorf("removed replica checked %d times", n)
	}

	// Removing a running replica stops its loops before Update returns.
	_, removed, err = f.Update([]Spec{{Name: "a", URL: fa.url(), Engine: EngineVLLM}})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(removed); !slices.Equal(got, []string{"c", "b"}) {
		t.Fatalf("removed %v", got)
	}
	hc, mc, hd, md := fc.healthHits.Load(), fc.metricsHits.Load(), fd.healthHits.Load(), fd.metricsHits.Load()
	time.Sleep(80 * time.Millisecond)
	if fc.healthHits.Load() != hc || fc.metricsHits.Load() != mc || fd.healthHits.Load() != hd || fd.metricsHits.Load() != md {
		t.Fatal("removed replicas still polled")
	}
	ma := fa.metricsHits.Load()
	eventually(t, "kept replica still polled", func() bool { return fa.metricsHits.Load() > ma })

	// Freed IDs are reused, lowest first; an invalid update changes nothing.
	added, _, err = f.Update([]Spec{{Name: "a", URL: fa.url(), Engine: EngineVLLM}, {Name: "d", URL: fd.url(), Engine: EngineVLLM}})
	if err != nil {
		t.Fatal(err)
	}
	if len(added) != 1 || added[0].ID() != 1 {
		t.Fatalf("added %v id %d, want d with id 1", names(added), added[0].ID())
	}
	if _, _, err := f.Update([]Spec{{Name: "a", URL: "nope", Engine: EngineVLLM}}); err == nil {
		t.Fatal("invalid update accepted")
	}
	if got := names(f.Replicas()); !slices.Equal(got, []string{"a", "d"}) {
		t.Fatalf("after rejected update: %v", got)
	}
	if f.ByName("b") != nil || f.ByName("c") != nil {
		t.Fatal("ByName finds removed replicas")
	}
}

func TestCheckNowHonoursContext(t *testing.T) {
	fake := newFakeReplica(t, vllmMinimal)
	fake.healthDelay.Store(int64(2 * time.Second))
	f := newTestFleet(t, []Spec{{Name: "a", URL: fake.url(), Engine: EngineVLLM}}, Options{HealthTimeout: 3 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	f.CheckNow(ctx)
	if d := time.Since(start); d > time.Second {
		t.Fatalf("CheckNow ignored its context for %v", d)
	}
	fake.srv.CloseClientConnections()
}

func names(rs []*Replica) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Name()
	}
	return out
}

func ExampleFleet() {
	fleet, err := NewFleet([]Spec{
		{Name: "gpu0", URL: "http://10.0.0.1:8000", Engine: EngineVLLM},
		{Name: "gpu1", URL: "http://10.0.0.2:30000", Engine: EngineSGLang, Models: []string{"llama"}},
	}, Options{}, nil)
	if err != nil {
		panic(err)
	}
	// fleet.Start(ctx) would begin health and metrics polling.
	for _, r := range fleet.Replicas() {
		fmt.Println(r.ID(), r.Name(), r.Healthy(), r.Serves("llama"))
	}
	// Output:
	// 0 gpu0 true true
	// 1 gpu1 true true
}
