package backends

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"go.uber.org/zap"
)

// holdServer is a replica on 127.0.0.1 whose /hold requests wait until
// release is closed; /health passes.
type holdServer struct {
	srv     *httptest.Server
	arrived chan struct{}
	release chan struct{}
}

func newHoldServer(t *testing.T) *holdServer {
	t.Helper()
	h := &holdServer{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			h.arrived <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(func() {
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		h.srv.Close()
	})
	return h
}

func doGet(r *Replica, path string) error {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	r.SetRequestURI(req, []byte(path))
	release := r.Acquire()
	defer release()
	err := r.Client().Do(req, resp)
	if err == nil {
		_ = resp.CloseBodyStream()
	}
	return err
}

// The errors of real operations, classified: what a replica did counts,
// what kvroute did or lacked does not.
func TestIsReplicaFault(t *testing.T) {
	hold := newHoldServer(t)
	f := newTestFleet(t, []Spec{
		{Name: "full", URL: hold.srv.URL, Engine: EngineVLLM},
		{Name: "dead", URL: closedURL(t), Engine: EngineVLLM},
	}, Options{MaxConnsPerReplica: 1, MaxConnWaitTimeout: 20 * time.Millisecond})
	full, dead := f.ByName("full"), f.ByName("dead")

	held := make(chan error, 1)
	go func() { held <- doGet(full, "/hold") }()
	<-hold.arrived
	noFreeConn := doGet(full, "/x") // waits 20ms for the one connection, in vain
	close(hold.release)
	if err := <-held; err != nil {
		t.Fatalf("held request: %v", err)
	}
	refused := doGet(dead, "/x")

	conn, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", hold.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	_, closedByUs := conn.Read(make([]byte, 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	emfile := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused, true},
		{"5xx", errors.New("status 503"), true},
		{"timeout", fasthttp.ErrTimeout, true},
		{"dial timeout", fasthttp.ErrDialTimeout, true},
		{"connection closed by the replica", fasthttp.ErrConnectionClosed, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"full pool", noFreeConn, false},
		{"full pool, wrapped", fmt.Errorf("attempt: %w", fasthttp.ErrNoFreeConns), false},
		{"connection closed by kvroute", closedByUs, false},
		{"cancelled", ctx.Err(), false},
		{"out of file descriptors", emfile, false},
		{"out of file descriptors, in a health check", fmt.Errorf("GET /health: %w", emfile), false},
		{"system file table full", os.NewSyscallError("socket", syscall.ENFILE), false},
		{"no local port", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)}, false},
		{"marked", NotReplicaFault(errors.New("response body exceeds limit")), false},
		{"marked, wrapped", fmt.Errorf("relay: %w", NotReplicaFault(errors.New("x"))), false},
		{"nil", nil, false},
	}
	if !errors.Is(noFreeConn, fasthttp.ErrNoFreeConns) {
		t.Fatalf("a request to a full pool failed with %v, want ErrNoFreeConns", noFreeConn)
	}
	if refused == nil || closedByUs == nil {
		t.Fatalf("refused %v, closed %v: want errors", refused, closedByUs)
	}
	for _, c := range cases {
		if got := IsReplicaFault(c.err); got != c.want {
			t.Errorf("%s (%v): IsReplicaFault %v, want %v", c.name, c.err, got, c.want)
		}
	}
	if NotReplicaFault(nil) != nil {
		t.Error("NotReplicaFault(nil) is not nil")
	}
}

// A full pool is load: reporting it neither counts nor ejects, and
// PoolFull says so while it lasts. A real fault still ejects.
func TestFullPoolIsNotAFailure(t *testing.T) {
	hold := newHoldServer(t)
	f, err := NewFleet([]Spec{{Name: "a", URL: hold.srv.URL, Engine: EngineVLLM}},
		Options{MaxConnsPerReplica: 2, MaxConnWaitTimeout: 10 * time.Millisecond, FailThreshold: 1}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stopAllForTest)
	r := f.ByName("a")

	if r.PoolFull() {
		t.Fatal("PoolFull with nothing in flight")
	}
	held := make(chan error, 2)
	for range 2 {
		go func() { held <- doGet(r, "/hold") }()
		<-hold.arrived
	}
	if !r.PoolFull() {
		t.Fatalf("PoolFull false with %d in flight of 2 connections", r.InFlight())
	}
	for range 5 {
		err := doGet(r, "/x")
		if !errors.Is(err, fasthttp.ErrNoFreeConns) {
			t.Fatalf("got %v, want ErrNoFreeConns", err)
		}
		r.ReportFailure(err)
	}
	if !r.Healthy() || r.Ejections() != 0 || r.ConsecutiveFailures() != 0 || r.LastError() != "" {
		t.Fatalf("after full-pool errors: healthy %v, ejections %d, failures %d, last error %q; want healthy, 0, 0, none",
			r.Healthy(), r.Ejections(), r.ConsecutiveFailures(), r.LastError())
	}
	close(hold.release)
	for range 2 {
		if err := <-held; err != nil {
			t.Fatal(err)
		}
	}
	if r.PoolFull() {
		t.Fatal("PoolFull once the connections are free")
	}

	r.ReportFailure(fmt.Errorf("dial: %w", syscall.ECONNREFUSED))
	if r.Healthy() || r.Ejections() != 1 {
		t.Fatalf("a refused connection at threshold 1: healthy %v, ejections %d; want ejected once", r.Healthy(), r.Ejections())
	}
}
