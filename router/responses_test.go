package router

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/oai"
)

// respClock is a settable clock for the responses table.
type respClock struct{ t time.Time }

func (c *respClock) now() time.Time          { return c.t }
func (c *respClock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newRespTable(ttl time.Duration, n int) (*Responses, *respClock) {
	c := &respClock{t: time.Unix(1_700_000_000, 0)}
	t := NewResponses(ttl, n)
	t.now = c.now
	return t, c
}

// respEject takes rep out of service through its passive failure count.
func respEject(t testing.TB, rep *backends.Replica) {
	t.Helper()
	for i := 0; i < 100 && rep.Healthy(); i++ {
		rep.ReportFailure(errors.New("down"))
	}
	if rep.Healthy() {
		t.Fatal("replica still in service")
	}
}

func TestResponsesRecordLookup(t *testing.T) {
	reps := testFleet(t, 2)
	tab, _ := newRespTable(time.Hour, 10)
	buf := []byte("resp_a")
	tab.Record(string(buf), reps[0])
	copy(buf, "resp_b") // the table keeps its own copy of the id
	tab.Record("resp_b", reps[1])
	if got := tab.Lookup("resp_a"); got != reps[0] {
		t.Errorf("resp_a on %v, want r0", got)
	}
	if got := tab.Lookup("resp_b"); got != reps[1] {
		t.Errorf("resp_b on %v, want r1", got)
	}
	if got := tab.Lookup("resp_c"); got != nil {
		t.Errorf("unknown id on %v", got.Name())
	}
	tab.Record("resp_a", reps[1]) // recorded again: the latest replica
	if got := tab.Lookup("resp_a"); got != reps[1] {
		t.Errorf("re-recorded resp_a on %v, want r1", got)
	}
	tab.Remove("resp_a")
	if got := tab.Lookup("resp_a"); got != nil || tab.Len() != 1 {
		t.Errorf("removed id still known (%v), %d entries", got, tab.Len())
	}
}

func TestResponsesIgnoresBadIDs(t *testing.T) {
	reps := testFleet(t, 1)
	tab, _ := newRespTable(time.Hour, 10)
	long := strings.Repeat("x", MaxResponseIDBytes+1)
	tab.Record(long, reps[0])
	tab.Record("", reps[0])
	tab.Record("resp_1", nil)
	if tab.Len() != 0 {
		t.Errorf("%d entries after bad records, want 0", tab.Len())
	}
	if tab.Lookup(long) != nil || tab.Lookup("") != nil {
		t.Error("a bad id is found")
	}
	edge := strings.Repeat("y", MaxResponseIDBytes)
	tab.Record(edge, reps[0])
	if tab.Lookup(edge) != reps[0] {
		t.Errorf("an id of %d bytes is not kept", MaxResponseIDBytes)
	}
	var none *Responses // a router without a table
	none.Record("resp_1", reps[0])
	none.Forget(reps[0])
	if none.Lookup("resp_1") != nil || none.Len() != 0 {
		t.Error("a nil table knows an id")
	}
}

func TestResponsesTTL(t *testing.T) {
	reps := testFleet(t, 1)
	tab, clock := newRespTable(time.Minute, 10)
	tab.Record("old", reps[0])
	tab.Record("used", reps[0])
	clock.advance(40 * time.Second)
	if tab.Lookup("used") == nil { // a use restarts its TTL
		t.Fatal("id lost before its TTL")
	}
	clock.advance(30 * time.Second) // old: 70s since recorded; used: 30s since used
	if got := tab.Lookup("old"); got != nil {
		t.Error("id kept past its TTL")
	}
	if got := tab.Lookup("used"); got == nil {
		t.Error("id used within its TTL was dropped")
	}
	clock.advance(time.Minute)
	tab.Record("new", reps[0]) // a record drops the expired entries
	if tab.Len() != 1 {
		t.Errorf("%d entries, want only the new one", tab.Len())
	}
}

func TestResponsesMaxEntriesEvictsLeastRecentlyUsed(t *testing.T) {
	reps := testFleet(t, 1)
	tab, clock := newRespTable(time.Hour, 3)
	for _, id := range []string{"a", "b", "c"} {
		tab.Record(id, reps[0])
		clock.advance(time.Second)
	}
	tab.Lookup("a") // b is now the least recently used
	tab.Record("d", reps[0])
	if tab.Len() != 3 {
		t.Fatalf("%d entries, bound 3", tab.Len())
	}
	for id, want := range map[string]bool{"a": true, "b": false, "c": true, "d": true} {
		if got := tab.Lookup(id) != nil; got != want {
			t.Errorf("%s kept %v, want %v", id, got, want)
		}
	}
	for i := 0; i < 100; i++ {
		tab.Record(fmt.Sprintf("x%d", i), reps[0])
	}
	if tab.Len() != 3 || tab.Lookup("x99") == nil || tab.Lookup("x96") != nil {
		t.Errorf("after 100 records: %d entries, x99 %v, x96 %v", tab.Len(), tab.Lookup("x99"), tab.Lookup("x96"))
	}
	tab.SetLimits(time.Hour, 1) // shrinking drops at once
	if tab.Len() != 1 {
		t.Errorf("%d entries after shrinking to 1", tab.Len())
	}
}

func TestResponsesForget(t *testing.T) {
	reps := testFleet(t, 2)
	tab, _ := newRespTable(time.Hour, 100)
	for i := 0; i < 10; i++ {
		tab.Record(fmt.Sprintf("r%d", i), reps[i%2])
	}
	tab.Forget(reps[0])
	if tab.Len() != 5 {
		t.Errorf("%d entries, want r1's 5", tab.Len())
	}
	for i := 0; i < 10; i++ {
		got := tab.Lookup(fmt.Sprintf("r%d", i))
		if want := map[bool]*backends.Replica{true: nil, false: reps[1]}[i%2 == 0]; got != want {
			t.Errorf("r%d on %v, want %v", i, got, want)
		}
	}
	tab.Record("again", reps[0]) // the list is intact after removals
	if tab.Lookup("again") != reps[0] || tab.Len() != 6 {
		t.Errorf("record after forget: %d entries", tab.Len())
	}
}

// routerWithResponses is a round-robin router over a fleet of n replicas,
// with a responses table.
func routerWithResponses(t *testing.T, n int) (*Router, []*backends.Replica, *Responses) {
	t.Helper()
	var specs []backends.Spec
	for i := 0; i < n; i++ {
		specs = append(specs, backends.Spec{Name: fmt.Sprintf("r%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 21000+i),
			Engine: backends.EngineVLLM, Models: []string{"m1"}})
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rt := New(f, &RoundRobin{})
	tab := NewResponses(time.Hour, 1000)
	rt.SetResponses(tab)
	return rt, f.Replicas(), tab
}

func TestRoutePinsToResponseReplica(t *testing.T) {
	rt, reps, tab := routerWithResponses(t, 3)
	tab.Record("resp_on_r2", reps[2])
	for i := 0; i < 9; i++ { // round-robin alone would spread these
		d, err := rt.Route(&Request{Kind: oai.KindResponses, Model: "m1", ResponseID: "resp_on_r2"}, nil)
		if err != nil || d.Replica != reps[2] || d.Reason != ResponseAffinity || !d.Pinned {
			t.Fatalf("try %d: %v %q pinned %v, %v; want r2 %q", i, d.Replica, d.Reason, d.Pinned, err, ResponseAffinity)
		}
		d, err = rt.NextFor("resp_on_r2", nil)
		if err != nil || d.Replica != reps[2] || d.Reason != ResponseAffinity || !d.Pinned {
			t.Fatalf("try %d, NextFor: %v %q, %v; want r2", i, d.Replica, d.Reason, err)
		}
	}
	// An unknown id is routed by the policy.
	seen := map[*backends.Replica]bool{}
	for i := 0; i < 3; i++ {
		d, err := rt.Route(&Request{Model: "m1", ResponseID: "resp_unknown"}, nil)
		if err != nil || d.Pinned || d.Reason != "round_robin" {
			t.Fatalf("unknown id: %q pinned %v, %v", d.Reason, d.Pinned, err)
		}
		seen[d.Replica] = true
		if d, _ := rt.NextFor("resp_unknown", nil); d.Pinned || d.Reason != "passthrough" {
			t.Fatalf("unknown id, NextFor: %q", d.Reason)
		}
	}
	if len(seen) != 3 {
		t.Errorf("unknown ids went to %d replicas, round-robin over 3", len(seen))
	}
	// A model the pinned replica does not serve: the policy decides (and
	// reports the unknown model).
	if _, err := rt.Route(&Request{Model: "other", ResponseID: "resp_on_r2"}, nil); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("unknown model with a pinned id: %v", err)
	}
}

func TestPinnedReplicaTriedIsNotReplaced(t *testing.T) {
	rt, reps, tab := routerWithResponses(t, 3)
	tab.Record("resp_1", reps[1])
	tried := []*backends.Replica{reps[1]}
	if d, err := rt.Route(&Request{Model: "m1", ResponseID: "resp_1"}, tried); !errors.Is(err, ErrResponseReplicaFailed) {
		t.Errorf("Route after the pinned replica failed: %v, %v", d.Replica, err)
	}
	if d, err := rt.NextFor("resp_1", tried); !errors.Is(err, ErrResponseReplicaFailed) {
		t.Errorf("NextFor after the pinned replica failed: %v, %v", d.Replica, err)
	}
	// Without an id, a retry goes on as before.
	if d, err := rt.NextFor("", tried); err != nil || d.Replica == reps[1] {
		t.Errorf("retry without an id: %v, %v", d.Replica, err)
	}
}

func TestUnavailablePinnedReplicaFallsBackToPolicy(t *testing.T) {
	rt, reps, tab := routerWithResponses(t, 2)
	tab.Record("resp_1", reps[0])
	respEject(t, reps[0])
	for i := 0; i < 4; i++ {
		d, err := rt.Route(&Request{Model: "m1", ResponseID: "resp_1"}, nil)
		if err != nil || d.Replica != reps[1] || d.Pinned {
			t.Fatalf("Route with the pinned replica out of service: %v pinned %v, %v", d.Replica, d.Pinned, err)
		}
		d, err = rt.NextFor("resp_1", nil)
		if err != nil || d.Replica != reps[1] || d.Pinned || d.Reason != "passthrough" {
			t.Fatalf("NextFor with the pinned replica out of service: %v %q, %v", d.Replica, d.Reason, err)
		}
	}
	if tab.Lookup("resp_1") != reps[0] {
		t.Error("an ejected replica's ids are forgotten: it may come back")
	}
}

func TestRemovedReplicaIsNotPinned(t *testing.T) {
	rt, reps, tab := routerWithResponses(t, 2)
	tab.Record("resp_1", reps[0])
	f := rt.fleet.(*backends.Fleet)
	_, removed, err := f.Update([]backends.Spec{reps[1].Spec()})
	if err != nil || len(removed) != 1 {
		t.Fatalf("update: %v, removed %d", err, len(removed))
	}
	// Even before Forget runs, a replica that left the fleet gets nothing.
	if d, err := rt.NextFor("resp_1", nil); err != nil || d.Replica != reps[1] || d.Pinned {
		t.Errorf("NextFor to a removed replica: %v pinned %v, %v", d.Replica, d.Pinned, err)
	}
	tab.Forget(removed[0])
	if tab.Len() != 0 {
		t.Errorf("%d entries after the replica left", tab.Len())
	}
}

// A response stored on a backup while the primaries were down stays there:
// once the primaries are back, its follow-ups still go to the backup.
func TestPinnedBackupOutlivesPrimaryRecovery(t *testing.T) {
	specs := []backends.Spec{
		{Name: "primary", URL: "http://127.0.0.1:21010", Engine: backends.EngineVLLM, Models: []string{"m1"}},
		{Name: "backup", URL: "http://127.0.0.1:21011", Engine: backends.EngineVLLM, Models: []string{"m1"}, Backup: true},
	}
	f, err := backends.NewFleet(specs, backends.Options{}, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	rt := New(f, &RoundRobin{})
	tab := NewResponses(time.Hour, 10)
	rt.SetResponses(tab)
	reps := f.Replicas()
	tab.Record("resp_b", reps[1])
	if d, err := rt.Route(&Request{Model: "m1"}, nil); err != nil || d.Replica != reps[0] {
		t.Fatalf("a plain request went to %v (%v), want the primary", d.Replica, err)
	}
	for _, pinnedOnly := range []bool{false, true} {
		var d Decision
		if pinnedOnly {
			d, err = rt.NextFor("resp_b", nil)
		} else {
			d, err = rt.Route(&Request{Model: "m1", ResponseID: "resp_b"}, nil)
		}
		if err != nil || d.Replica != reps[1] || !d.Pinned {
			t.Errorf("NextFor %v: went to %v (pinned %v, %v), want the backup that holds the response", pinnedOnly, d.Replica, d.Pinned, err)
		}
	}
}
