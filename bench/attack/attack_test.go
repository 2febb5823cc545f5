package attack

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/internal/kvtest"
)

// serveArg makes the test binary serve kvroute, standing in for
// `kvroute serve`: TestMain runs it before any test when os.Args[1] is it.
// Under -race the child carries the race detector's shadow memory too,
// which only makes the memory checks stricter.
const serveArg = "attack-test-serve-kvroute"

func TestMain(m *testing.M) { kvtest.Main(m, serveArg) }

func testEnv(t *testing.T) *env {
	t.Helper()
	// A test's attacks share the deadline: the memory test runs six.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return &env{ctx: ctx, command: []string{os.Args[0], serveArg}, dir: t.TempDir(), sizes: DefaultSizes(), notes: nil, bound: &Bound{}}
}

// kvroute under the small limits of MemorySettings, attacked by
// connections that declare 8 MiB bodies and send one byte, by connections
// that send 2 MiB of such bodies and wait, by clients that never read
// 10 MB answers, by 24 requests of 100,000 messages at once, by a KV-event
// publisher storing 500,000 blocks then sending a 38 MB batch, and by a
// cluster member forging 200,000 placements, stays under the memory
// formula for those limits (VmHWM, the process's peak resident memory),
// and still answers a normal request. Without a global body budget the formula's body term is
// max_connections × max_body_bytes, no bound worth holding: the test fails.
func TestMemoryUnderFormulaWhileAttacked(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("resident memory is read from /proc/<pid>/status: Linux only")
	}
	if !Known("limits.max_body_buffer_bytes") {
		t.Error("limits.max_body_buffer_bytes is not in the configuration: without a global budget for bodies being read, the formula's body term is limits.max_connections × limits.max_body_bytes (300 × 8 MiB)")
	}
	e := testEnv(t)
	tests := []struct {
		name string
		n    int
		run  func(k *kvroute, up *Upstream, n int) (memRun, error)
	}{
		{"body flood", 250, func(k *kvroute, _ *Upstream, n int) (memRun, error) { return bodyFloodMem(k, n) }},
		{"partial bodies", 100, func(k *kvroute, _ *Upstream, n int) (memRun, error) {
			m, _, err := partialBodiesMem(k, n, 2<<20)
			return m, err
		}},
		{"unread answers", 100, unreadAnswersMem},
		{"many messages", 24, func(k *kvroute, _ *Upstream, n int) (memRun, error) {
			m, _, err := manyMessagesMem(k, n, 100_000)
			return m, err
		}},
	}
	// The sources that need a peer of their own (a KV-event publisher, a
	// cluster member) run as their attacks do, each under the formula of
	// its configuration.
	rows := []struct {
		name string
		run  func(*env) (Result, error)
	}{
		{"kv block flood", func(e *env) (Result, error) {
			saved := kvSizes
			defer func() { kvSizes = saved }()
			kvSizes.FloodBlocks = 500_000
			return kvBlockFlood(e)
		}},
		{"cluster placements flood", func(e *env) (Result, error) { return placementsFlood(e, 200_000) }},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			res, err := r.run(e)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res.Figure)
			if !res.Held || !strings.Contains(res.Figure, "formula") {
				t.Errorf("did not hold under the formula: %s", res.Figure)
			}
		})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			k, ups, stop, err := e.start(strings.ReplaceAll(tc.name, " ", "-"), 1, MemorySettings())
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			m, err := tc.run(k, ups[0], tc.n)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: baseline %s, during %s, peak %s; formula:\n%s", tc.name, mib(m.Base.RSS), mib(m.During.RSS), mib(m.Peak.HWM), m.Bound.Markdown())
			if len(m.Bound.Missing) > 0 {
				t.Errorf("formula lacks limits: %v", m.Bound.Missing)
			}
			if m.Peak.HWM > m.Bound.Total {
				t.Errorf("peak resident memory %s over the formula's %s", mib(m.Peak.HWM), mib(m.Bound.Total))
			}
			if !normalOK(m.Normal) {
				t.Errorf("normal request during the attack: %s %.200s", describe(m.Normal), m.Normal.Body)
			}
		})
	}
}

// The formula adds each limit's term, the heap terms doubled, and says
// which limits stood in for absent ones.
func TestFormula(t *testing.T) {
	cfg, err := config.LoadBytes("t.yaml", []byte(`
limits:
  max_connections: 100
  max_inflight: 10
  max_header_bytes: 8192
  max_body_bytes: 1048576
tokenizer:
  cache_bytes: 1048576
cache_aware:
  tree_max_bytes: 2097152
session:
  max_entries: 1000
responses:
  max_entries: 1000
backends:
  - name: a
    url: http://127.0.0.1:1
`), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := Formula(cfg, 10<<20)
	var sum int64
	for _, term := range b.Terms {
		sum += GCFactor * term.Bytes
	}
	if b.Total != 10<<20+sum {
		t.Fatalf("total %d, want baseline + 2 × terms = %d", b.Total, 10<<20+sum)
	}
	want := map[string]int64{
		"token cache":   1 << 20,
		"prefix tree":   2 << 20,
		"sessions":      1000 * SessionEntryBytes,
		"response ids":  1000 * ResponseEntryBytes,
		"connections":   100 * (8192 + ConnWriteBufferBytes + ConnOverheadBytes),
		"request state": 10 * RequestStateBytes,
	}
	if Known("limits.max_body_buffer_bytes") {
		v, _ := Setting(cfg, "limits.max_body_buffer_bytes")
		want["request bodies"] = v
	} else {
		want["request bodies"] = 100 << 20
	}
	if v, ok := Setting(cfg, "limits.max_buffered_response_bytes"); ok {
		want["buffered answers"] = 10 * v
	} else {
		want["buffered answers"] = 10 * DefaultBufferedAnswerBytes
	}
	for _, term := range b.Terms {
		if w, ok := want[term.Name]; ok && term.Bytes != w {
			t.Errorf("%s = %d, want %d (%s)", term.Name, term.Bytes, w, term.Note)
		}
		delete(want, term.Name)
	}
	if len(want) > 0 {
		t.Errorf("terms missing: %v", want)
	}
	if _, ok := Setting(cfg, "limits.no_such_limit"); ok {
		t.Error("Setting found a key the configuration lacks")
	}
}

// The other attacks against real kvroute processes, the sessions' at a
// tenth of their size: each holds, and the table lists them all.
func TestRunAttacks(t *testing.T) {
	out := t.TempDir()
	names := []string{"pool-full", "slow-reader", "session-ids", "user-fields", "stray-bytes", "absolute-form-host", "connect",
		"no-content-type", "header-name-space", "chunked-trailers", "upstream-101", "bare-lf-head", "conn-cap", "idle-keepalive"}
	sizes := DefaultSizes()
	sizes.SessionIDs, sizes.UserFields = 2000, 20
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var notes strings.Builder
	rep, err := Run(ctx, Options{Command: []string{os.Args[0], serveArg}, Out: out, Attacks: names, Sizes: sizes, Notes: &notes})
	t.Log(notes.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != len(names) {
		t.Fatalf("%d results, want %d", len(rep.Results), len(names))
	}
	for _, r := range rep.Results {
		if !r.Held {
			t.Errorf("%s did not hold: %s", r.Attack, r.Figure)
		}
	}
	md, err := os.ReadFile(filepath.Join(out, FileMarkdown))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if !strings.Contains(string(md), "| "+n+" | ") {
			t.Errorf("results.md lacks %s:\n%s", n, md)
		}
	}
}
