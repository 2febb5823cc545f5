package attack

import (
	"fmt"
	"reflect"
	"strings"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/precise"
)

// Per-unit costs of the memory formula (docs/memory.md), in bytes: sizes
// the code sets, checked against (and rounded up from) what the attack
// runs of this package measured on linux/amd64 (the "idle-conns",
// "body-flood", "unread-answers" and "session-ids" rows of kvroute bench
// attack).
const (
	// SessionEntryBytes is one session binding (session.max_entries),
	// as config.Session documents: a 128-bit digest, the replica and the
	// LRU links.
	SessionEntryBytes = 160
	// ResponseEntryBytes is one Responses-API id binding (responses.max_entries).
	ResponseEntryBytes = 410
	// ConnWriteBufferBytes is fasthttp's per-connection write buffer (its default).
	ConnWriteBufferBytes = 4 << 10
	// ConnOverheadBytes is the rest of a client connection: its goroutine's
	// stack, fasthttp's request context, the first 8 KiB of a body fasthttp
	// reads before the handler runs, and kvroute's per-connection state.
	// Measured (idle-conns, body-flood): Go heap and stacks per connection,
	// less the read buffer, 11 KiB idle and 20 KiB with a body begun.
	ConnOverheadBytes = 24 << 10
	// TLSConnBytes is crypto/tls's state per connection (two record buffers
	// of up to 16 KiB and the handshake state). Not measured by the attack
	// runs, which are plain TCP: the size of the buffers crypto/tls keeps.
	TLSConnBytes = 48 << 10
	// RequestStateBytes is one in-flight request's own state beyond its
	// body and answer: the forwarded request, the replica's response
	// object and connection buffers, the relay's copy buffer and the
	// routing key. Measured (unread-answers): Go heap and stacks per
	// request in flight with its answer relayed and unread, less its
	// client connection: about 75 KiB.
	RequestStateBytes = 96 << 10
	// GCFactor is the Go heap's growth over the live heap before a
	// collection at GOGC=100: the heap can reach twice the live data.
	GCFactor = 2
	// PrefillAnswerBytes is the most of a prefill replica's answer a
	// disaggregated request reads (proxy's maxPrefillAnswer).
	PrefillAnswerBytes = 1 << 20
	// TenantStateBytes is one tenant's limit state (flow.Limiter), at
	// most flow.tenant_limits.max_tenants of them: about 140 B measured
	// (flow's TestTenantMemory).
	TenantStateBytes = 140
	// QueueEntryBytes is one request waiting in kvroute's queue beyond
	// its in-flight state: its flow.Item, wake channel and timer (about
	// 350 B) and the goroutine watching its client (a few KiB of stack).
	QueueEntryBytes = 8 << 10
	// DefaultBufferedAnswerBytes is what one answer may hold in memory
	// when limits.max_buffered_response_bytes is absent: fasthttp's
	// client reads an answer up to 256 MiB whole.
	DefaultBufferedAnswerBytes = 256 << 20
)

// Term is one line of the formula.
type Term struct {
	Name  string
	Bytes int64
	Note  string // the limits it comes from
	Heap  bool   // part of the Go heap (multiplied by GCFactor)
}

// Bound is the worst-case resident memory of a kvroute from its limits.
type Bound struct {
	Baseline int64
	Terms    []Term
	Total    int64
	// Missing lists the limits the formula would use that this kvroute
	// lacks, and what stood in for them.
	Missing []string
}

// Setting returns the numeric value of the configuration key (as in
// config.yaml) in cfg, and false when the configuration has no such key.
func Setting(cfg *config.Config, key string) (int64, bool) {
	v := reflect.ValueOf(cfg).Elem()
	for part := range strings.SplitSeq(key, ".") {
		if v.Kind() != reflect.Struct {
			return 0, false
		}
		found := false
		for i := range v.NumField() {
			if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("mapstructure"), ","); tag == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return 0, false
		}
	}
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return int64(v.Uint()), true
	}
	return 0, false
}

// Formula computes the worst-case resident memory of a kvroute running
// cfg, whose idle resident memory (binary, vocabulary, runtime) is
// baseline: baseline + GCFactor × (heap terms) + the other terms.
func Formula(cfg *config.Config, baseline int64) Bound {
	b := Bound{Baseline: baseline}
	get := func(key string) int64 { v, _ := Setting(cfg, key); return v }
	conns := get("limits.max_connections")
	inflight := get("limits.max_inflight")
	header := get("limits.max_header_bytes")
	body := get("limits.max_body_bytes")
	add := func(t Term) { b.Terms = append(b.Terms, t) }

	add(Term{"token cache", get("tokenizer.cache_bytes"), "tokenizer.cache_bytes", true})
	add(Term{"prefix tree", get("index.tree_max_bytes"), "index.tree_max_bytes", true})
	add(Term{"sessions", get("session.max_entries") * SessionEntryBytes, fmt.Sprintf("session.max_entries × %d B", SessionEntryBytes), true})
	if _, ok := Setting(cfg, "session.max_entries"); !ok {
		b.Missing = append(b.Missing, "session.max_entries: the session table has no bound, no term stands in")
	}
	add(Term{"response ids", get("responses.max_entries") * ResponseEntryBytes, fmt.Sprintf("responses.max_entries × %d B", ResponseEntryBytes), true})
	perConn := header + ConnWriteBufferBytes + ConnOverheadBytes
	connNote := fmt.Sprintf("limits.max_connections × (max_header_bytes read buffer + %d KiB write buffer + %d KiB stack and state)", ConnWriteBufferBytes>>10, ConnOverheadBytes>>10)
	if cfg.TLS.CertFile != "" {
		perConn += TLSConnBytes
		connNote += fmt.Sprintf(" + %d KiB TLS", TLSConnBytes>>10)
	}
	add(Term{"connections", conns * perConn, connNote, true})
	if budget, ok := Setting(cfg, "limits.max_body_buffer_bytes"); ok {
		add(Term{"request bodies", budget, "limits.max_body_buffer_bytes (global budget for bodies)", true})
	} else {
		add(Term{"request bodies", conns * body, "limits.max_connections × limits.max_body_bytes (no global body budget in this kvroute)", true})
		b.Missing = append(b.Missing, "limits.max_body_buffer_bytes: max_connections × max_body_bytes stands in")
	}
	if buf, ok := Setting(cfg, "limits.max_buffered_response_bytes"); ok {
		add(Term{"buffered answers", inflight * buf, "limits.max_inflight × limits.max_buffered_response_bytes", true})
	} else {
		add(Term{"buffered answers", inflight * DefaultBufferedAnswerBytes, "limits.max_inflight × 256 MiB (answers read whole: no limits.max_buffered_response_bytes)", true})
		b.Missing = append(b.Missing, "limits.max_buffered_response_bytes: 256 MiB per answer stands in")
	}
	add(Term{"request state", inflight * RequestStateBytes, fmt.Sprintf("limits.max_inflight × %d KiB", RequestStateBytes>>10), true})
	if budget, ok := Setting(cfg, "limits.max_body_buffer_bytes"); ok {
		add(Term{"request parsing", ParseBytesPerBodyByte * budget, fmt.Sprintf("%d × limits.max_body_buffer_bytes (routing fields of the bodies being read)", ParseBytesPerBodyByte), true})
	} else {
		add(Term{"request parsing", ParseBytesPerBodyByte * conns * body, fmt.Sprintf("%d × limits.max_connections × limits.max_body_bytes", ParseBytesPerBodyByte), true})
	}
	if t, ok := kvEventsTerm(cfg); ok {
		add(t)
	}
	if cfg.Disaggregation.Protocol != "" {
		budget, _ := Setting(cfg, "limits.max_body_buffer_bytes")
		add(Term{"disaggregation", 2*budget + inflight*PrefillAnswerBytes,
			"2 × limits.max_body_buffer_bytes (the prefill and decode bodies rebuilt from the bodies in the budget) + limits.max_inflight × 1 MiB (prefill answers)", true})
	}
	if tenants, ok := Setting(cfg, "flow.tenant_limits.max_tenants"); ok {
		add(Term{"tenant limits", tenants * TenantStateBytes, fmt.Sprintf("flow.tenant_limits.max_tenants × %d B", TenantStateBytes), true})
		add(Term{"flow queue", get("flow.max_queued") * QueueEntryBytes, fmt.Sprintf("flow.max_queued × %d KiB (entries and client watches; their requests count in flight)", QueueEntryBytes>>10), true})
	}
	if cfg.Cluster.Enabled {
		add(Term{"cluster placements", get("cluster.max_peers") * get("cluster.max_peer_placement_bytes"), "cluster.max_peers × cluster.max_peer_placement_bytes", true})
		add(Term{"cluster journal", 3 * get("cluster.journal_bytes"), "3 × cluster.journal_bytes (the journal and the two resyncs answered at once)", true})
	}

	b.Total = baseline
	for _, t := range b.Terms {
		if t.Heap {
			b.Total += GCFactor * t.Bytes
		} else {
			b.Total += t.Bytes
		}
	}
	return b
}

// Markdown renders the bound as a table.
func (b Bound) Markdown() string {
	var s strings.Builder
	s.WriteString("| term | bytes | from |\n|---|---:|---|\n")
	fmt.Fprintf(&s, "| baseline | %s | measured: idle resident memory after the first request |\n", mib(b.Baseline))
	for _, t := range b.Terms {
		fmt.Fprintf(&s, "| %s | %s | %s |\n", t.Name, mib(t.Bytes), t.Note)
	}
	fmt.Fprintf(&s, "| **total** | **%s** | baseline + %d × the terms above (Go heap at GOGC=100) |\n", mib(b.Total), GCFactor)
	for _, m := range b.Missing {
		fmt.Fprintf(&s, "\nnot in this kvroute: %s\n", m)
	}
	return s.String()
}

// mib formats bytes in MiB (KiB below 1 MiB).
func mib(n int64) string {
	if n < 1<<20 && n > -(1<<20) {
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// signed formats a growth in bytes with its sign.
func signed(n int64) string {
	if n < 0 {
		return "-" + mib(-n)
	}
	return "+" + mib(n)
}

// kvEventsTerm is the KV-events term of cfg in precise mode: for each
// replica with kv_events, its blocks (twice its capacity, at least 1,024 and
// at most precise.DefaultMaxBlocks; without backends[].cache_tokens the
// cap itself) at KVBlockBytes, its messages read ahead and one batch being
// decoded (KVMessageBytes). False when no replica follows events.
func kvEventsTerm(cfg *config.Config) (Term, bool) {
	if !cfg.Precise.Enabled() {
		return Term{}, false
	}
	var total int64
	n := 0
	for _, b := range cfg.Backends {
		if b.KVEvents == nil {
			continue
		}
		n++
		total += KVEventsBytes(cfg.Precise.MaxEventBytes, b.CacheTokens)
	}
	if n == 0 {
		return Term{}, false
	}
	note := fmt.Sprintf("%d replicas × (min(%d, max(1,024, 2 × backends[].cache_tokens)) × %d B + %d × precise.max_event_bytes + 2 MiB)",
		n, precise.DefaultMaxBlocks, KVBlockBytes, KVMessageFactor)
	return Term{"KV events", total, note, true}, true
}
