package attack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/bench/loopback"
	"github.com/kvroute/kvroute/kvevents"
	"github.com/kvroute/kvroute/precise"
)

// The KV-event attacks: a replica's publisher (backends[].kv_events, in
// precise mode) that sends what no engine sends.

// Configuration keys the KV-event attacks set.
const (
	keyTreeBytes = "index.tree_max_bytes"
	keyLogLevel  = "log.level"
)

// eventsPub is a hostile KV-event publisher on raw TCP: every connection
// gets a PUB socket's ZMTP handshake, then what script writes.
type eventsPub struct {
	ln     net.Listener
	script func(w io.Writer) error
	wg     sync.WaitGroup
}

func startEventsPub(script func(w io.Writer) error) (*eventsPub, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &eventsPub{ln: ln, script: script}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

func (p *eventsPub) endpoint() string { return "tcp://" + p.ln.Addr().String() }

func (p *eventsPub) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { _ = c.Close() }()
			go func() { _, _ = io.Copy(io.Discard, c) }()
			w := bufio.NewWriterSize(c, 1<<20)
			if _, err := w.Write(kvevents.ZMTPHandshake("PUB")); err != nil {
				return
			}
			if p.script(w) == nil && w.Flush() == nil {
				time.Sleep(time.Second) // let it all be read before the close
			}
		}()
	}
}

func (p *eventsPub) close() {
	_ = p.ln.Close()
	p.wg.Wait()
}

// eventMsg is the live message [topic, seq, payload].
func eventMsg(dst []byte, seq int64, payload []byte) []byte {
	sb := binary.BigEndian.AppendUint64(nil, uint64(seq)) //nolint:gosec // the wire carries the bits
	return kvevents.AppendZMTPMessage(dst, []byte("kv"), sb, payload)
}

// startEvents starts a hostile upstream and a kvroute in precise mode in
// front of it, its events read from pub (render_url is the upstream, whose
// renders fail: requests are keyed approximately, the events still
// followed).
func (e *env) startEvents(name string, pub *eventsPub, s Settings) (*kvroute, func(), error) {
	up, err := StartUpstream()
	if err != nil {
		return nil, nil, err
	}
	all := Settings{"precise.render_url": up.URL(), keyTreeBytes: 4 << 20}
	for k, v := range s {
		all[k] = v
	}
	k, err := startEventsKvroute(e.ctx, e.command, filepath.Join(e.dir, name), up.URL(), pub.endpoint(), all)
	if err != nil {
		up.Close()
		return nil, nil, err
	}
	return k, func() { k.stop(); up.Close() }, nil
}

// eventsAttack starts a hostile publisher running script and a kvroute
// following it (startEvents); stop stops both.
func (e *env) eventsAttack(name string, script func(io.Writer) error, s Settings) (k *kvroute, stop func(), err error) {
	pub, err := startEventsPub(script)
	if err != nil {
		return nil, nil, err
	}
	k, stopK, err := e.startEvents(name, pub, s)
	if err != nil {
		pub.close()
		return nil, nil, err
	}
	return k, func() { stopK(); pub.close() }, nil
}

// eventsMemAttack is eventsAttack for an attack on memory: it reads
// kvroute's resident memory once it has started (base), runs attack, and
// stops the publisher and kvroute.
func (e *env) eventsMemAttack(name string, script func(io.Writer) error, s Settings, attack func(k *kvroute, base Mem) (Result, error)) (Result, error) {
	k, stop, err := e.eventsAttack(name, script, s)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	base, err := ReadMem(k.pid())
	if err != nil {
		return Result{}, err
	}
	return attack(k, base)
}

// sendOnce is a script that writes stream on the first connection only
// (later ones are closed after the handshake).
func sendOnce(stream []byte) func(io.Writer) error {
	var once sync.Once
	return func(w io.Writer) error {
		err := errors.New("sent already")
		once.Do(func() { _, err = w.Write(stream) })
		return err
	}
}

// startEventsKvroute is startKvroute for one backend whose kv_events are
// at endpoint.
func startEventsKvroute(ctx context.Context, command []string, dir, upstream, endpoint string, s Settings) (*kvroute, error) {
	// cache_tokens states the replica's capacity (its metrics' GPU blocks
	// of 16 tokens), which bounds its event state and the formula's term.
	return startKvroute(ctx, command, dir, []string{upstream}, s,
		fmt.Sprintf("    cache_tokens: %d\n    kv_events:\n      endpoint: %q\n", upstreamBlocks*16, endpoint))
}

// rejected is the sum of kvroute_kv_events_rejected_total of reason.
func (k *kvroute) rejected(reason string) float64 {
	m, err := k.labelled("kvroute_kv_events_rejected_total", "reason")
	if err != nil {
		return -1
	}
	return m[reason]
}

// labelled returns metric name's values by its label label, summed over
// its other labels.
func (k *kvroute) labelled(name, label string) (map[string]float64, error) {
	ms, err := k.samples(name)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, m := range ms {
		v, ok := value(m)
		if !ok {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += v
			}
		}
	}
	return out, nil
}

// awaitKV polls cond every 50 ms for up to d; false when it never held or
// kvroute exited.
func awaitKV(k *kvroute, d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end) && k.alive(); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// kvFrameHuge: one frame header declaring 1 TiB.
func kvFrameHuge(e *env) (Result, error) {
	k, stop, err := e.eventsAttack("kv-frame-huge", func(w io.Writer) error {
		_, err := w.Write(kvevents.AppendZMTPHeader(nil, 0, 1<<40))
		return err
	}, nil)
	if err != nil {
		return Result{}, err
	}
	defer stop()
	seen := awaitKV(k, 10*time.Second, func() bool { return k.rejected("frame_too_large") >= 1 })
	a := k.normal(10 * time.Second)
	if !k.alive() {
		return Result{Figure: "kvroute exited" + tailOf(k)}, nil
	}
	rss := "n/a"
	if m, err := ReadMem(k.pid()); err == nil {
		rss = mib(m.HWM)
	}
	return Result{Held: seen && normalOK(a), Figure: fmt.Sprintf("alive; %.0f connections rejected (frame_too_large); normal request %s; peak RSS %s",
		k.rejected("frame_too_large"), describe(a), rss)}, nil
}

// kvSizes are how hard the KV-event attacks push: the figures,
// which tests lower.
var kvSizes = struct {
	StreamBytes int64 // kv-frame-stream's frame
	Garbage     int   // kv-garbage's messages
	FloodBlocks int   // kv-block-flood's BlockStored blocks
}{2 << 30, 100_000, 4_500_000}

// kvFrameStream: a frame declaring 2 GiB, streamed in full.
func kvFrameStream(e *env) (Result, error) {
	if !MemSupported {
		return Result{}, errNoMem
	}
	size := kvSizes.StreamBytes
	chunk := make([]byte, 1<<20)
	script := func(w io.Writer) error {
		if _, err := w.Write(kvevents.AppendZMTPHeader(nil, 0, uint64(size))); err != nil { //nolint:gosec // positive
			return err
		}
		for sent := int64(0); sent < size; sent += int64(len(chunk)) {
			if _, err := w.Write(chunk); err != nil {
				return err
			}
		}
		return nil
	}
	return e.eventsMemAttack("kv-frame-stream", script, nil, func(k *kvroute, base Mem) (Result, error) {
		st, done, err := settle(k, base, 20*time.Second, func() bool { return k.rejected("frame_too_large") >= 3 })
		if done != nil || err != nil {
			return *done, err
		}
		return Result{Held: st.seen && normalOK(st.a) && st.grew < 64<<20, Figure: fmt.Sprintf("frames of %s declared: %.0f connections rejected; peak RSS %s, %s over the %s at start; normal request %s",
			mib(size), k.rejected("frame_too_large"), mib(st.peak.HWM), mib(st.grew), mib(base.RSS), describe(st.a))}, nil
	})
}

// kvGarbage: 100,000 messages of one byte.
func kvGarbage(e *env) (Result, error) {
	n := kvSizes.Garbage
	var stream []byte
	for i := range n {
		stream = kvevents.AppendZMTPMessage(stream, []byte{byte(i)})
	}
	k, stop, err := e.eventsAttack("kv-garbage", sendOnce(stream), Settings{keyLogLevel: "info"})
	if err != nil {
		return Result{}, err
	}
	defer stop()
	seen := awaitKV(k, 30*time.Second, func() bool { return k.rejected("malformed") >= float64(n) })
	time.Sleep(200 * time.Millisecond)
	log, err := os.ReadFile(filepath.Join(k.dir, "kvroute.log"))
	if err != nil {
		return Result{}, err
	}
	lines := bytes.Count(log, []byte("kv events"))
	return Result{Held: seen && lines < 100 && k.alive(), Figure: fmt.Sprintf("%d garbage messages, %.0f counted malformed: %d log lines about KV events (%s of log in all)",
		n, k.rejected("malformed"), lines, mib(int64(len(log))))}, nil
}

// floodStream is blocks distinct blocks in batches of 1,000 runs of 16
// blocks of 16 tokens, then one batch of about bigBytes.
func floodStream(blocks, bigBytes int) ([]byte, error) {
	const run, bs = 16, 16
	toks := make([]uint32, run*bs)
	for i := range toks {
		toks[i] = uint32(i % 100) //nolint:gosec // small
	}
	var stream []byte
	seq := int64(0)
	batch := func(n int) ([]byte, error) {
		evs := make([]kvevents.Event, 0, n)
		for range n {
			hs := make([]uint64, run)
			for j := range hs {
				hs[j] = uint64(seq)<<32 | uint64(len(evs))<<8 | uint64(j) //nolint:gosec // distinct test hashes
			}
			evs = append(evs, kvevents.BlockStored{BlockHashes: hs, TokenIDs: toks, BlockSize: bs, Medium: "GPU"})
		}
		return kvevents.Encode(kvevents.Batch{TS: float64(time.Now().Unix()), Events: evs}, kvevents.Tagged)
	}
	per := 1
	for sent := 0; sent < blocks; sent += 1000 * run {
		n := min(1000, (blocks-sent+run-1)/run)
		p, err := batch(n)
		if err != nil {
			return nil, err
		}
		per = max(per, len(p)/n)
		stream = eventMsg(stream, seq, p)
		seq++
	}
	p, err := batch(bigBytes / per)
	if err != nil {
		return nil, err
	}
	return eventMsg(stream, seq, p), nil
}

// kvBlockFlood: 4.5 M BlockStored from one replica, then a 38 MB batch.
func kvBlockFlood(e *env) (Result, error) {
	if !MemSupported {
		return Result{}, errNoMem
	}
	const bigBytes = 38_000_000
	stream, err := floodStream(kvSizes.FloodBlocks, bigBytes)
	if err != nil {
		return Result{}, err
	}
	// Under the memory runs' small limits, the formula's own bound.
	return e.eventsMemAttack("kv-block-flood", sendOnce(stream), MemorySettings(), func(k *kvroute, base Mem) (Result, error) {
		cfg, err := loaded(k)
		if err != nil {
			return Result{}, err
		}
		blocks := kvSizes.FloodBlocks
		// The big batch comes last: once it is rejected, the flood before it
		// was all read.
		done := awaitKV(k, 120*time.Second, func() bool { return k.rejected("frame_too_large")+k.rejected("message_too_large") >= 1 })
		held, _ := k.metric("kvroute_kv_events_blocks")
		st, _ := k.labelled("kvroute_kv_events_blocks_total", "event")
		a := k.normal(10 * time.Second)
		if !k.alive() {
			return Result{Figure: "kvroute exited" + tailOf(k)}, nil
		}
		peak, formula, err := underFormula(k, base.RSS)
		if err != nil {
			return Result{}, err
		}
		bound := base.RSS + KVEventsBound(cfg.Precise.MaxEventBytes, upstreamBlocks)
		return Result{Held: done && normalOK(a) && peak.HWM <= bound && peak.HWM <= formula.Total, Figure: fmt.Sprintf("%d blocks sent, %.0f applied, %.0f kept at the end; the 38 MB batch rejected %.0f times; peak RSS %s (start %s, bound for a replica of %d blocks %s, formula %s); normal request %s",
			blocks, st["stored"], held["h-0"], k.rejected("frame_too_large")+k.rejected("message_too_large"), mib(peak.HWM), mib(base.RSS), upstreamBlocks, mib(bound), mib(formula.Total), describe(a))}, nil
	})
}

// KVBlockBytes is the memory a replica's KV-event state takes per engine
// block kept, at most (docs/memory.md): under 160 B for blocks of the key
// block's size (67 B measured live, with room for the map and slots
// doubling), 240 B for one-token pages (precise's package doc).
const KVBlockBytes = 240

// upstreamBlocks is the GPU blocks the hostile upstream's metrics report
// (num_gpu_blocks).
const upstreamBlocks = 8192

// KVMessageFactor is how many times precise.max_event_bytes one replica's
// event messages may hold at once: the messages read ahead (the live and
// the replay socket's, max_event_bytes and 1 MiB each) and one batch
// being decoded (at most 4 × max_event_bytes).
const KVMessageFactor = 6

// KVEventsBytes is docs/memory.md's KV-events term for one replica whose
// capacity is capBlocks engine blocks (0: unknown, the cap applies):
// min(precise.DefaultMaxBlocks, max(1,024, 2 × (capBlocks + 1))) ×
// KVBlockBytes + KVMessageFactor × max_event_bytes + 2 MiB.
func KVEventsBytes(maxEventBytes, capBlocks int64) int64 {
	blocks := int64(precise.DefaultMaxBlocks)
	if capBlocks > 0 {
		blocks = min(blocks, max(1024, 2*(capBlocks+1)))
	}
	return blocks*KVBlockBytes + KVMessageFactor*maxEventBytes + 2<<20
}

// KVEventsBound is KVEventsBytes with the garbage collector's factor.
func KVEventsBound(maxEventBytes, capBlocks int64) int64 {
	return GCFactor * KVEventsBytes(maxEventBytes, capBlocks)
}

// kvStrangers is kv-listen-strangers' connections.
var kvStrangers = 2000

// kvListenStrangers: a kvroute that listens for its replica's publisher
// (kv_events.listen, allow_from ::1 only) takes connections from 127.0.0.1,
// each sending a PUB handshake and a frame declaring 1 TiB. Every one must
// be refused unread and counted, kvroute must keep answering, and its
// memory stay flat.
func kvListenStrangers(e *env) (Result, error) {
	if !MemSupported {
		return Result{}, errNoMem
	}
	up, err := StartUpstream()
	if err != nil {
		return Result{}, err
	}
	defer up.Close()
	addr, err := loopback.FreeAddr()
	if err != nil {
		return Result{}, err
	}
	k, err := startKvroute(e.ctx, e.command, filepath.Join(e.dir, "kv-listen-strangers"), []string{up.URL()},
		Settings{"precise.render_url": up.URL(), keyTreeBytes: 4 << 20},
		fmt.Sprintf("    cache_tokens: %d\n    kv_events:\n      listen: %q\n      allow_from: [\"::1\"]\n", upstreamBlocks*16, "tcp://"+addr))
	if err != nil {
		return Result{}, err
	}
	defer k.stop()
	base, err := ReadMem(k.pid())
	if err != nil {
		return Result{}, err
	}
	hostile := append(kvevents.ZMTPHandshake("PUB"), kvevents.AppendZMTPHeader(nil, 0, 1<<40)...)
	var wg sync.WaitGroup
	var dialed atomic.Int64
	sem := make(chan struct{}, 64)
	for range kvStrangers {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(e.ctx, "tcp", addr)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			dialed.Add(1)
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Write(hostile)
			_, _ = io.Copy(io.Discard, c) // until kvroute closes it
		})
	}
	wg.Wait()
	n := float64(dialed.Load())
	st, done, err := settle(k, base, 10*time.Second, func() bool { return k.rejected("peer_refused") >= n })
	if done != nil || err != nil {
		return *done, err
	}
	return Result{Held: st.seen && n > 0 && normalOK(st.a) && k.rejected("frame_too_large") == 0 && st.grew < 32<<20,
		Figure: fmt.Sprintf("%d connections from an address not allowed, each with a 1 TiB frame: %.0f refused unread (peer_refused), %.0f frames read; peak RSS %s, %s over the %s at start; normal request %s",
			kvStrangers, k.rejected("peer_refused"), k.rejected("frame_too_large"), mib(st.peak.HWM), mib(st.grew), mib(base.RSS), describe(st.a))}, nil
}

// settled is what settle saw after an attack on the events.
type settled struct {
	seen bool   // the attack's effect was counted in time
	a    Answer // a normal request's
	peak Mem
	grew int64 // peak resident memory over base's
}

// settle waits up to d for seen, sends a normal request and reads kvroute's
// peak memory. done is the result to report as it is when kvroute exited
// (with err nil), or nil.
func settle(k *kvroute, base Mem, d time.Duration, seen func() bool) (settled, *Result, error) {
	st := settled{seen: awaitKV(k, d, seen), a: k.normal(10 * time.Second)}
	if !k.alive() {
		return st, &Result{Figure: "kvroute exited" + tailOf(k)}, nil
	}
	var err error
	if st.peak, err = ReadMem(k.pid()); err != nil {
		return st, &Result{}, err
	}
	st.grew = st.peak.HWM - base.RSS
	return st, nil, nil
}
