package attack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/config"
)

// FileMarkdown is the report written into Options.Out.
const FileMarkdown = "results.md"

// Options configure a run.
type Options struct {
	// Command serves kvroute; "--config <file>" is appended. Default: this
	// executable's "serve".
	Command []string
	// Out is the directory for results.md and each attack's kvroute
	// configuration and log; "" writes them into a temporary directory,
	// removed afterwards.
	Out string
	// Attacks to run, by name (Names); empty runs all.
	Attacks []string
	// Sizes of the attacks.
	Sizes Sizes
	// Notes receives progress lines; nil discards them.
	Notes io.Writer
}

// Sizes are how hard each attack pushes.
type Sizes struct {
	BodyFloodConns  int // connections declaring max_body_bytes and sending 1 byte
	PartialBodies   int // connections declaring max_body_bytes and sending 2 MiB
	UnreadAnswers   int // clients never reading a 10 MB answer
	PoolHolders     int // streams held open per replica beyond its pool
	SessionIDs      int // session IDs of 16 KB
	UserFields      int // user fields of 1 MB
	IdleConns       int // connections with an unfinished request head
	ConnCapOverflow int // connections past limits.max_connections
}

// DefaultSizes are the figures.
func DefaultSizes() Sizes {
	return Sizes{BodyFloodConns: 200, PartialBodies: 100, UnreadAnswers: 100, PoolHolders: 70, SessionIDs: 20000, UserFields: 200, IdleConns: 250, ConnCapOverflow: 20}
}

// Result is one attack's row.
type Result struct {
	Attack string
	Held   bool
	Figure string
}

// Report is a run's results.
type Report struct {
	Results []Result
	Notes   []string
	// Bound is the memory formula for MemorySettings, with the baseline
	// measured in the body-flood run (zero when it did not run).
	Bound Bound
}

// Markdown renders the table: attack | held | figure.
func (r *Report) Markdown() string {
	var b strings.Builder
	b.WriteString("| attack | held | figure |\n|---|---|---|\n")
	for _, x := range r.Results {
		held := "no"
		if x.Held {
			held = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", x.Attack, held, strings.ReplaceAll(x.Figure, "|", "/"))
	}
	for _, n := range r.Notes {
		b.WriteString("\n" + n + "\n")
	}
	if r.Bound.Total > 0 {
		b.WriteString("\nMemory formula for the limits of the memory runs (" + strings.Join(memoryAttacks, ", ") + "; docs/memory.md), baseline measured in body-flood:\n\n" + r.Bound.Markdown())
	}
	return b.String()
}

// Held reports whether every attack held.
func (r *Report) Held() bool {
	for _, x := range r.Results {
		if !x.Held {
			return false
		}
	}
	return len(r.Results) > 0
}

// MemorySettings are the small limits of the memory runs (body-flood,
// unread-answers, idle-conns) and of the test that holds kvroute under the
// formula: the keys this kvroute does not know are left out.
func MemorySettings() Settings {
	return Settings{
		"limits.max_connections":             300,
		"limits.max_body_bytes":              8 << 20,
		"limits.max_body_buffer_bytes":       32 << 20,
		"limits.max_inflight":                200,
		"limits.max_buffered_response_bytes": 256 << 10,
		"tokenizer.cache_bytes":              4 << 20,
		"index.tree_max_bytes":               4 << 20,
		"session.max_entries":                1000,
		"responses.max_entries":              1000,
	}
}

// env is what an attack runs with.
type env struct {
	ctx     context.Context
	command []string
	dir     string
	sizes   Sizes
	notes   io.Writer
	bound   *Bound

	// shared is the kvroute the forwarding attacks share (forwarding).
	shared struct {
		k    *kvroute
		ups  []*Upstream
		stop func()
	}
}

// forwarding returns the kvroute, started on first use, that the
// forwarding attacks share: one hostile upstream, timeouts.first_byte 5s,
// no retries. Its attacks look only at their own requests.
func (e *env) forwarding() (*kvroute, []*Upstream, error) {
	if e.shared.k == nil {
		k, ups, stop, err := e.start("forwarding", 1, Settings{"timeouts.first_byte": "5s", "retries": 0})
		if err != nil {
			return nil, nil, err
		}
		e.shared.k, e.shared.ups, e.shared.stop = k, ups, stop
	}
	return e.shared.k, e.shared.ups, nil
}

// close stops the shared kvroute.
func (e *env) close() {
	if e.shared.stop != nil {
		e.shared.stop()
		e.shared.k, e.shared.stop = nil, nil
	}
}

// start starts n hostile upstreams and a kvroute in front of them.
func (e *env) start(name string, n int, s Settings) (*kvroute, []*Upstream, func(), error) {
	var ups []*Upstream
	var urls []string
	closeUps := func() {
		for _, u := range ups {
			u.Close()
		}
	}
	for range n {
		u, err := StartUpstream()
		if err != nil {
			closeUps()
			return nil, nil, nil, err
		}
		ups = append(ups, u)
		urls = append(urls, u.URL())
	}
	k, err := startKvroute(e.ctx, e.command, filepath.Join(e.dir, name), urls, s, "")
	if err != nil {
		closeUps()
		return nil, nil, nil, err
	}
	return k, ups, func() { k.stop(); closeUps() }, nil
}

type attack struct {
	name string
	run  func(e *env) (Result, error)
}

// attacks in the order they run.
var attacks = []attack{
	{"body-flood", bodyFlood},
	{"partial-bodies", partialBodies},
	{"unread-answers", unreadAnswers},
	{"idle-conns", idleConns},
	{"pool-full", poolFull},
	{"slow-reader", slowReader},
	{"session-ids", sessionIDs},
	{"user-fields", userFields},
	{"stray-bytes", strayBytes},
	{"absolute-form-host", absoluteHost},
	{"connect", connectMethod},
	{"no-content-type", noContentType},
	{"header-name-space", headerSpace},
	{"chunked-trailers", chunkedTrailers},
	{"upstream-101", upstreamSwitch},
	{"bare-lf-head", bareLF},
	{"conn-cap", connCap},
	{"idle-keepalive", idleKeepAlive},
	{"kv-frame-huge", kvFrameHuge},
	{"kv-frame-stream", kvFrameStream},
	{"kv-garbage", kvGarbage},
	{"kv-block-flood", kvBlockFlood},
	{"kv-listen-strangers", kvListenStrangers},
	{"cluster-rogue-join", clusterRogueJoin},
	{"cluster-forged-load", clusterForgedLoad},
	{"cluster-forged-lead", clusterForgedLead},
	{"cluster-placements-flood", clusterPlacementsFlood},
	{"cluster-peer-ids", clusterPeerIDs},
	{"many-messages", manyMessages},
	{"route-oracle", routeOracle},
	{"salt-isolation", saltIsolation},
}

// memoryAttacks read the process's resident memory (Linux only) under
// MemorySettings; the report gives the formula for those limits.
var memoryAttacks = []string{"body-flood", "partial-bodies", "unread-answers", "idle-conns"}

// linuxOnly are the attacks that read resident memory: memoryAttacks and
// those that check it against bounds of their own.
var linuxOnly = append(slices.Clone(memoryAttacks), "kv-frame-stream", "kv-block-flood", "cluster-placements-flood", "many-messages")

// Names lists the attacks.
func Names() []string {
	out := make([]string, len(attacks))
	for i, a := range attacks {
		out[i] = a.name
	}
	return out
}

// Run runs the attacks, each against its own kvroute process, and writes
// results.md into o.Out.
func Run(ctx context.Context, o Options) (*Report, error) {
	for _, n := range o.Attacks {
		if !slices.Contains(Names(), n) {
			return nil, fmt.Errorf("unknown attack %q (have %s)", n, strings.Join(Names(), ", "))
		}
	}
	command := o.Command
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		command = []string{exe, "serve"}
	}
	dir := o.Out
	if dir == "" {
		tmp, err := os.MkdirTemp("", "kvroute-attack-")
		if err != nil {
			return nil, err
		}
		defer func() { _ = os.RemoveAll(tmp) }()
		dir = tmp
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	notes := o.Notes
	if notes == nil {
		notes = io.Discard
	}
	sizes := o.Sizes
	if sizes == (Sizes{}) {
		sizes = DefaultSizes()
	}
	rep := &Report{}
	if !MemSupported {
		rep.Notes = append(rep.Notes, "Resident memory is read from /proc/<pid>/status, which only Linux has: skipped here: "+strings.Join(linuxOnly, ", ")+".")
	}
	var missing []string
	for k := range MemorySettings() {
		if !Known(k) {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		rep.Notes = append(rep.Notes, "Not in this kvroute's configuration (left out of the memory runs): "+strings.Join(missing, ", ")+".")
	}
	e := &env{ctx: ctx, command: command, dir: dir, sizes: sizes, notes: notes, bound: &rep.Bound}
	defer e.close()
	for _, a := range attacks {
		if len(o.Attacks) > 0 && !slices.Contains(o.Attacks, a.name) {
			continue
		}
		if !MemSupported && slices.Contains(linuxOnly, a.name) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		start := time.Now()
		r, err := a.run(e)
		r.Attack = a.name
		if err != nil {
			r.Held = false
			r.Figure = "error: " + err.Error()
		}
		_, _ = fmt.Fprintf(notes, "%s: held=%v %s (%.1fs)\n", a.name, r.Held, r.Figure, time.Since(start).Seconds())
		rep.Results = append(rep.Results, r)
	}
	if o.Out != "" {
		if err := os.WriteFile(filepath.Join(o.Out, FileMarkdown), []byte(rep.Markdown()), 0o644); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// loaded is the configuration the kvroute under attack runs.
func loaded(k *kvroute) (*config.Config, error) {
	return config.Load(filepath.Join(k.dir, "kvroute.yaml"), nil)
}

// errNoMem is an attack's error where resident memory can't be read.
var errNoMem = errors.New("resident memory is read from /proc/<pid>/status: Linux only")
