package chaos

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChaosBrief runs the whole timeline in about 12 s: nothing may be
// lost, no request may reach a second replica after an answer, every
// fault must be ejected (garbage /metrics: must not be) and restored, and
// clear failures must stay few.
func TestChaosBrief(t *testing.T) {
	rep := runBrief(t, nil)
	// With garbage metrics, sim-3 still serves (it is the only sound one).
	if p := rep.Phases[4]; p.ServedBy[3] == 0 {
		t.Errorf("sim-3 served nothing while its /metrics were garbage: %v", p.ServedBy)
	}
	// Killed, hung and failing replicas serve nothing successfully.
	if p := rep.Phases[4]; p.ServedBy[0]+p.ServedBy[1]+p.ServedBy[2] != 0 {
		t.Errorf("faulty replicas served requests: %v", p.ServedBy)
	}
}

// The same timeline over a fleet split 3:3 into prefill and decode
// replicas (vLLM's protocol): a killed, hung or failing prefill replica
// (sim-0, sim-2) and decode replica (sim-1) lose nothing either, and
// only decode replicas answer clients.
func TestChaosBriefDisaggregated(t *testing.T) {
	rep := runBrief(t, func(o *Options) { o.Replicas, o.Disaggregated = 6, "3:3" })
	for i, p := range rep.Phases {
		if p.ServedBy[0]+p.ServedBy[2]+p.ServedBy[4] != 0 {
			t.Errorf("phase %d: prefill replicas answered clients: %v", i, p.ServedBy)
		}
	}
}

// runBrief runs a short chaos timeline (options changed by mod, when not
// nil) and checks what holds of every fleet: nothing lost, no second
// replica after an answer, few clear failures, retries, every fault
// handled and every phase served.
func runBrief(t *testing.T, mod func(*Options)) *Report {
	t.Helper()
	if testing.Short() {
		t.Skip("chaos run takes ~12 s")
	}
	o := DefaultOptions()
	o.Rate = 15
	o.Phases = []time.Duration{
		1 * time.Second,         // normal
		1500 * time.Millisecond, // kill
		2 * time.Second,         // + hang
		1500 * time.Millisecond, // + 500s
		1500 * time.Millisecond, // + garbage metrics
		1500 * time.Millisecond, // restore
		1 * time.Second,         // normal
	}
	o.MaxTokens = 64
	o.Users, o.Turns = 12, 6
	o.HealthInterval = 200 * time.Millisecond
	o.HealthTimeout = 400 * time.Millisecond
	o.FirstByte = time.Second
	o.StreamIdle = time.Second
	o.RequestTimeout = 10 * time.Second
	o.Out = t.TempDir()
	if mod != nil {
		mod(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	md := rep.Markdown()
	t.Logf("\n%s", md)

	if rep.Lost != 0 {
		t.Errorf("%d requests lost", rep.Lost)
	}
	if len(rep.Violations) != 0 {
		t.Errorf("%d requests sent to a second replica after an answer", len(rep.Violations))
	}
	if want := int(0.8 * o.Rate * 10); rep.Sent < want {
		t.Errorf("sent %d requests, want at least %d", rep.Sent, want)
	}
	if most := rep.Sent / 10; rep.Failed > most {
		t.Errorf("%d requests failed (with a clear error), want at most %d", rep.Failed, most)
	}
	if rep.Retried == 0 || rep.RetriesMetric == 0 {
		t.Errorf("no retries (seen by two replicas %d, kvroute_retries_total +%v): the faults did not bite", rep.Retried, rep.RetriesMetric)
	}
	if len(rep.Faults) != 4 {
		t.Fatalf("%d faults, want 4", len(rep.Faults))
	}
	for _, f := range rep.Faults {
		if !f.OK {
			t.Errorf("fault %s on sim-%d: ejected %v (after %.2fs, %d times), restored %v (after %.2fs); expect ejection %v",
				f.Mode, f.Replica, f.Ejected, f.EjectS, f.Ejections, f.Restored, f.RestoreS, f.ExpectEject)
		}
	}
	for i, p := range rep.Phases {
		if p.Sent == 0 || p.Succeeded == 0 {
			t.Errorf("phase %d (%s): %d sent, %d succeeded", i, p.Name, p.Sent, p.Succeeded)
		}
	}
	if !rep.Pass() || !strings.Contains(md, "PASS") {
		t.Errorf("report does not pass")
	}
	return rep
}

// TestInjectorModes checks the injector's fault modes and its accounting
// against a trivial handler, without kvroute.
func TestInjectorModes(t *testing.T) {
	rec := NewRecorder(time.Now())
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = io.WriteString(w, "ok_metric 1\n")
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"hello":"world"}`)
	})
	inj, err := NewInjector(t.Context(), 0, h, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer inj.Close()
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(id string) (int, string, error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, inj.URL()+"/v1/chat/completions", strings.NewReader("{}"))
		req.Header.Set(RequestIDHeader, id)
		return send(client, req)
	}
	// attempts waits a little for the injector's accounting, which ends
	// after the client may have read the response.
	attempts := func(id string, done func([]AttemptInfo) bool) []AttemptInfo {
		var as []AttemptInfo
		for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
			if as = rec.Attempts(id); done(as) || time.Now().After(deadline) {
				return as
			}
		}
	}

	status, body, err := post("a")
	if err != nil || status != 200 || body != `{"hello":"world"}` {
		t.Fatalf("normal: %d %q %v", status, body, err)
	}
	as := attempts("a", func(as []AttemptInfo) bool { return len(as) == 1 && as[0].BodyBytes == 17 })
	if len(as) != 1 || as[0].Status != 200 || as[0].BodyBytes != int64(len(`{"hello":"world"}`)) || as[0].HeadBytes == 0 {
		t.Errorf("normal: attempts %+v", as)
	}

	if err := inj.SetMode(ModeError500); err != nil {
		t.Fatal(err)
	}
	status, body, err = post("b")
	if err != nil || status != 500 {
		t.Fatalf("error500: %d %v", status, err)
	}
	if !strings.Contains(body, `"error"`) {
		t.Errorf("error500 body %q", body)
	}
	if as := attempts("b", func(as []AttemptInfo) bool { return len(as) == 1 && as[0].Status != 0 }); len(as) != 1 || as[0].Status != 500 || as[0].AnsweredBefore(1e12) {
		t.Errorf("error500: attempts %+v", as)
	}

	if err := inj.SetMode(ModeGarbageMetrics); err != nil {
		t.Fatal(err)
	}
	mreq, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, inj.URL()+"/metrics", nil)
	_, body, err = send(client, mreq)
	if err != nil {
		t.Fatal(err)
	}
	if body == "ok_metric 1\n" {
		t.Errorf("garbage metrics: got the real metrics")
	}

	if err := inj.SetMode(ModeHang); err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 300 * time.Millisecond, Transport: &http.Transport{}}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, inj.URL()+"/v1/chat/completions", strings.NewReader("{}"))
	req.Header.Set(RequestIDHeader, "c")
	if _, _, err := send(hc, req); err == nil {
		t.Errorf("hang: got an answer")
	}
	time.Sleep(50 * time.Millisecond) // let the aborted handler finish
	if as := rec.Attempts("c"); len(as) != 1 || as[0].HeadBytes != 0 || as[0].FirstOutMs != -1 {
		t.Errorf("hang: attempts %+v (nothing may be written, not even after the client gave up)", as)
	}

	if err := inj.SetMode(ModeKilled); err != nil {
		t.Fatal(err)
	}
	if inj.Resets() == 0 {
		t.Errorf("killed: the client's open keep-alive connection was not reset")
	}
	d := net.Dialer{Timeout: time.Second}
	_, err = d.DialContext(t.Context(), "tcp", strings.TrimPrefix(inj.URL(), "http://"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("killed: dial error %v, want connection refused", err)
	}
	if err := inj.SetMode(ModeNormal); err != nil {
		t.Fatal(err)
	}
	client.CloseIdleConnections()
	if status, _, err = post("d"); err != nil || status != 200 {
		t.Fatalf("restored: %d %v", status, err)
	}
}

// send sends req with c and returns the answer's status and body (as much
// of it as could be read), the body closed.
func send(c *http.Client, req *http.Request) (int, string, error) {
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestResetConnRecordsNoArrival: a request the server read before a kill
// reset its connection, but handled after, is not recorded as reaching
// the replica (by then kvroute may have had its answer from another, and
// the late record would read as a second replica after an answer); one
// handled before the reset is.
func TestResetConnRecordsNoArrival(t *testing.T) {
	rec := NewRecorder(time.Now())
	inj := &Injector{rec: rec, index: 3}
	a, b := net.Pipe()
	defer func() { _ = b.Close() }()
	tc := &trackedConn{Conn: a, inj: inj}
	if !tc.begin(inj, "before") {
		t.Fatal("begin on a live connection reported it reset")
	}
	tc.reset()
	if tc.begin(inj, "after") {
		t.Error("begin after the reset reported the connection live")
	}
	if as := rec.Attempts("before"); len(as) != 1 || as[0].Replica != 3 {
		t.Errorf("before the reset: attempts %+v, want one at replica 3", as)
	}
	if as := rec.Attempts("after"); len(as) != 0 {
		t.Errorf("after the reset: attempts %+v, want none", as)
	}
}

func TestDisaggregatedRoles(t *testing.T) {
	cases := []struct {
		split    string
		replicas int
		want     string // first letters, or the error
	}{
		{"", 4, ""},
		{"3:3", 6, "pdpdpd"},
		{"4:3", 7, "pdpdpdp"},
		{"5:3", 8, "pdpdpdpp"},
		{"2:4", 6, "P and D at least 3"},
		{"3:3", 7, "P+D the replicas"},
		{"x", 6, "want P:D"},
	}
	for _, tc := range cases {
		o := Options{Replicas: tc.replicas, Disaggregated: tc.split}
		roles, err := o.roles()
		got := ""
		for _, r := range roles {
			got += r[:1]
		}
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) || tc.want == "" && got != "" {
			t.Errorf("roles(%q, %d) = %q, want %q", tc.split, tc.replicas, got, tc.want)
		}
	}
}
