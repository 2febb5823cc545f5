package runner

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/kvtest"
)

// startNamed serves an HTTP server on 127.0.0.1:0 that answers every
// request with name; it returns its host:port and a function that closes
// it (listener and connections).
func startNamed(t *testing.T, name string) (addr string, stop func()) {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, name)
	})}
	go func() { _ = srv.Serve(ln) }()
	stop = func() { _ = srv.Close() }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// get sends GET url through client and returns the body.
func get(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The front hands each new connection to the next server in turn, keeps a
// connection's requests on its server, and skips a server that stopped.
func TestFrontSpreadsConnectionsAndSkipsDeadTarget(t *testing.T) {
	names := []string{"a", "b", "c"}
	addrs := make([]string, 0, len(names))
	stops := map[string]func(){}
	for _, n := range names {
		addr, stop := startNamed(t, n)
		addrs = append(addrs, addr)
		stops[n] = stop
	}
	f, err := startFront(t.Context(), addrs)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	url := "http://" + f.Addr() + "/"
	noKeepAlive := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

	var got []string
	for range 6 {
		got = append(got, get(t, noKeepAlive, url))
	}
	if s := strings.Join(got, ""); s != "abcabc" {
		t.Fatalf("new connections went to %q, want abcabc", s)
	}

	// One kept-alive connection: every request on it reaches one server.
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}
	keepAlive := &http.Client{Transport: tr}
	first := get(t, keepAlive, url)
	for range 4 {
		if s := get(t, keepAlive, url); s != first {
			t.Fatalf("a kept-alive connection's requests went to %s and %s", first, s)
		}
	}
	tr.CloseIdleConnections()

	stops["b"]()
	got = got[:0]
	for range 6 {
		got = append(got, get(t, noKeepAlive, url))
	}
	if s := strings.Join(got, ""); strings.Contains(s, "b") || strings.Count(s, "a") != 3 || strings.Count(s, "c") != 3 {
		t.Fatalf("after b stopped, new connections went to %q, want a and c in turn", s)
	}
	if h := f.Handed(); h[1] != 2 {
		t.Fatalf("b was handed %d connections, want 2 (before it stopped): %v", h[1], h)
	}
}

// cut resets the connections relayed to one target: a request waiting on
// it fails at once, and the front keeps serving through the others.
func TestFrontCutResetsConnections(t *testing.T) {
	release := make(chan struct{})
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	slow := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		<-release
		_, _ = io.WriteString(w, "slow")
	})}
	go func() { _ = slow.Serve(ln) }()
	defer func() { close(release); _ = slow.Close() }()
	other, _ := startNamed(t, "other")

	f, err := startFront(t.Context(), []string{ln.Addr().String(), other})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	client := &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	errc := make(chan error, 1)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+f.Addr()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			_ = resp.Body.Close()
		}
		errc <- err
	}()
	kvtest.WaitFor(t, 5*time.Second, "the first connection to reach the first target", func() bool { return f.Handed()[0] == 1 })
	f.cut(0)
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a request on a cut connection succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request on a cut connection still waits")
	}
	if s := get(t, client, "http://"+f.Addr()+"/"); s != "other" {
		t.Fatalf("next connection went to %q, want other", s)
	}
}

// Two kvroute instances behind the front, sharing through their cluster,
// run a short multi-turn workload over the simulated fleet without an
// error, and the report compares them with one instance, which exchanges
// nothing.
func TestInstancesRun(t *testing.T) {
	o := tinyOptions(t)
	o.Instances = []int{1, 2}
	rep := runWithin(t, o, 90*time.Second)
	ir := rep.Instances
	if ir == nil || len(ir.Rows) != 2 || len(rep.Results) != 2 {
		t.Fatalf("want 2 rows and 2 results, got %+v and %d results", ir, len(rep.Results))
	}
	for _, row := range ir.Rows {
		t.Logf("%+v", row)
		if row.Error != "" || row.Errors != 0 || row.OK != rep.Requests {
			t.Fatalf("%d instances: %d/%d ok, %d errors %q", row.Instances, row.OK, rep.Requests, row.Errors, row.Error)
		}
		if len(row.Connections) != row.Instances {
			t.Fatalf("%d instances: connections %v", row.Instances, row.Connections)
		}
	}
	one, two := ir.Rows[0], ir.Rows[1]
	if !reflect.DeepEqual(one.Traffic, ClusterTraffic{}) || one.HitRateVsOne != 1 || one.TTFTP90VsOne != 1 {
		t.Fatalf("one instance: traffic %+v, ratios %v %v", one.Traffic, one.HitRateVsOne, one.TTFTP90VsOne)
	}
	if tr := two.Traffic; tr.SentMessages == 0 || tr.ReceivedMessages == 0 || tr.Records == 0 || two.BytesPerRequest <= 0 {
		t.Fatalf("two instances exchanged %+v (%.0f B per request)", tr, two.BytesPerRequest)
	}
	// Each placement of one instance reached the other: the lags counted
	// are the placements both made, less any still in flight at the end.
	if lag := two.Traffic.Lag; lag.Count == 0 || lag.Count > uint64(rep.Requests) || bucketSum(lag.Buckets) != lag.Count {
		t.Fatalf("two instances: placement lag %+v over %d requests", lag, rep.Requests)
	}
	if two.HitRateVsOne <= 0 || two.TTFTP90VsOne <= 0 {
		t.Fatalf("two instances: ratios to one %v %v", two.HitRateVsOne, two.TTFTP90VsOne)
	}
}

// Killing the second of two instances halfway loses at most the requests
// on it, one per connection it had: the front hands the clients' new
// connections to the first, which routes the rest of the run.
func TestInstancesKill(t *testing.T) {
	o := tinyOptions(t)
	o.Instances = []int{2}
	o.KillInstanceAt = 0.5
	rep := runWithin(t, o, 90*time.Second)
	row := rep.Instances.Rows[0]
	k := row.Kill
	if k == nil || k.Instance != "kv-1" || k.Dispatched < uint64(rep.Requests/2) {
		t.Fatalf("kill %+v, want kv-1 after %d dispatched", k, rep.Requests/2)
	}
	t.Logf("%+v, kill %+v, errors %v", row, *k, rep.Results[0].Summary.ErrorsByKind)
	if row.OK+row.Errors != rep.Requests || row.Errors > k.Connections {
		t.Fatalf("%d ok, %d errors of %d requests; kv-1 had %d requests in flight on %d connections when it was stopped",
			row.OK, row.Errors, rep.Requests, k.InFlight, k.Connections)
	}
}

func bucketSum(b []uint64) uint64 {
	var n uint64
	for _, c := range b {
		n += c
	}
	return n
}

// The family runs a shape through numbers of instances as bench
// --instances runs one workload: rows shape × instances, and the shape's
// own report the instances comparison.
func TestFamilyInstances(t *testing.T) {
	o := DefaultOptions()
	o.Replicas = 2
	o.TimeScale = 0.02
	o.Instances = []int{1, 2}
	o.Out = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunFamily(ctx, FamilyOptions{Options: o, Seed: 3, Scale: 0.1, Shapes: []string{ShapeTenants}})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Shapes) != 1 || len(rep.Shapes[0].Rows) != 2 {
		t.Fatalf("want one shape of two rows, got %+v", rep.Shapes)
	}
	s := rep.Shapes[0]
	for i, row := range s.Rows {
		if want := fmt.Sprintf("kvroute/cache_aware×%d", i+1); row.Router != want {
			t.Errorf("row %d is %q, want %q", i, row.Router, want)
		}
		if row.Error != "" || row.Errors != 0 || row.OK != s.Requests || row.OfIdeal <= 0 {
			t.Errorf("%s: error %q, %d/%d ok, %.3f of the ideal", row.Router, row.Error, row.OK, s.Requests, row.OfIdeal)
		}
	}
	md, err := os.ReadFile(filepath.Join(o.Out, ShapeTenants, FileMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(md), "through 1 to N kvroute instances") || !strings.Contains(rep.Markdown(), "kvroute instances sharing their cluster") {
		t.Errorf("the shape's report or the family table does not say it compares instances:\n%s\n%s", md, rep.Markdown())
	}
}
