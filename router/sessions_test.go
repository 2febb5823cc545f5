package router

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvroute/kvroute/backends"
	"github.com/kvroute/kvroute/index"
	"github.com/kvroute/kvroute/internal/liveheap"
)

// sessionModel is the naive table the bounded one must behave as: a map
// and a list in order of last binding, most recent first.
type sessionModel struct {
	ttl     int64
	max     int
	maxID   int
	m       map[string]modelEntry
	order   []string
	evicted int64
	reject  int64
}

type modelEntry struct {
	rep  *backends.Replica
	seen int64
}

func (m *sessionModel) remove(id string) {
	delete(m.m, id)
	for i, o := range m.order {
		if o == id {
			m.order = append(m.order[:i], m.order[i+1:]...)
			return
		}
	}
}

func (m *sessionModel) lookup(id string, now int64) *backends.Replica {
	if id == "" || len(id) > m.maxID {
		return nil
	}
	e, ok := m.m[id]
	if !ok {
		return nil
	}
	if now-e.seen > m.ttl {
		return nil // left for bind or the bound to drop
	}
	return e.rep
}

func (m *sessionModel) bind(id string, rep *backends.Replica, now int64) func() {
	if id == "" {
		return func() {}
	}
	if len(id) > m.maxID {
		m.reject++
		return func() {}
	}
	prev, had := m.m[id]
	if had {
		m.remove(id)
	} else if len(m.m) >= m.max {
		m.remove(m.order[len(m.order)-1])
		m.evicted++
	}
	m.m[id] = modelEntry{rep, now}
	m.order = append([]string{id}, m.order...)
	for range trimPerBind {
		last := m.order[len(m.order)-1]
		if last == id || now-m.m[last].seen <= m.ttl {
			break
		}
		m.remove(last)
	}
	return func() {
		cur, ok := m.m[id]
		if !ok || cur.rep != rep {
			return
		}
		if had {
			m.m[id] = prev
		} else {
			m.remove(id)
		}
	}
}

func (m *sessionModel) forget(rep *backends.Replica) {
	for _, id := range append([]string(nil), m.order...) {
		if m.m[id].rep == rep {
			m.remove(id)
		}
	}
}

func (m *sessionModel) setLimits(maxEntries, maxID int) {
	m.max, m.maxID = maxEntries, maxID
	for len(m.m) > m.max {
		m.remove(m.order[len(m.order)-1])
		m.evicted++
	}
}

// The bounded table agrees with the naive model on every lookup, its size
// and its counters, over random sequences of binds, undos, lookups,
// forgets, bound changes and time passing.
func TestSessionsMatchNaiveModel(t *testing.T) {
	reps := testFleet(t, 3)
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		ttl := time.Duration(1+rng.IntN(50)) * time.Second
		maxEntries, maxID := 1+rng.IntN(12), 4+rng.IntN(6)
		s := NewSessions(ttl)
		s.SetLimits(maxEntries, maxID)
		m := &sessionModel{ttl: int64(ttl), max: maxEntries, maxID: maxID, m: map[string]modelEntry{}}
		ids := make([]string, 24)
		for i := range ids {
			ids[i] = strings.Repeat("s", rng.IntN(4)) + strconv.Itoa(i) + strings.Repeat("x", rng.IntN(8))
		}
		ids[0] = ""
		now := time.Unix(1_000_000, 0)
		type undoPair struct{ real, model func() }
		var undos []undoPair
		for step := range 3000 {
			id := ids[rng.IntN(len(ids))]
			rep := reps[rng.IntN(len(reps))]
			switch op := rng.IntN(100); {
			case op < 45:
				undos = append(undos, undoPair{s.Bind(id, rep, now), m.bind(id, rep, now.UnixNano())})
			case op < 55 && len(undos) > 0:
				i := rng.IntN(len(undos))
				undos[i].real()
				undos[i].model()
				undos = append(undos[:i], undos[i+1:]...)
			case op < 85:
				if got, want := s.Lookup(id, now), m.lookup(id, now.UnixNano()); got != want {
					t.Fatalf("seed %d step %d: Lookup(%q) = %s, model %s", seed, step, id, repName(got), repName(want))
				}
			case op < 87:
				s.Forget(rep)
				m.forget(rep)
			case op < 89:
				maxEntries, maxID = 1+rng.IntN(12), 4+rng.IntN(6)
				s.SetLimits(maxEntries, maxID)
				m.setLimits(maxEntries, maxID)
			default:
				now = now.Add(time.Duration(rng.IntN(int(ttl/time.Millisecond)/4+1)) * time.Millisecond)
			}
			st := s.Stats()
			if st.Entries != len(m.m) || st.MaxEntries != m.max || st.Evicted != m.evicted || st.Rejected != m.reject {
				t.Fatalf("seed %d step %d: stats %+v, model entries %d max %d evicted %d rejected %d",
					seed, step, st, len(m.m), m.max, m.evicted, m.reject)
			}
			if st.Entries > st.MaxEntries {
				t.Fatalf("seed %d step %d: %d entries over the bound %d", seed, step, st.Entries, st.MaxEntries)
			}
		}
		for _, id := range ids {
			if got, want := s.Lookup(id, now), m.lookup(id, now.UnixNano()); got != want {
				t.Fatalf("seed %d end: Lookup(%q) = %s, model %s", seed, id, repName(got), repName(want))
			}
		}
	}
}

// With max_entries bindings held, one more distinct session evicts the
// least recently bound; one bound again just before stays.
func TestSessionsEvictLeastRecentlyBound(t *testing.T) {
	reps := testFleet(t, 2)
	now := time.Now()
	s := NewSessions(time.Hour)
	s.SetLimits(3, 0)
	for _, id := range []string{"a", "b", "c"} {
		s.Bind(id, reps[0], now)
	}
	s.Bind("a", reps[1], now) // a is now the most recently used
	s.Bind("d", reps[0], now) // max_entries+1: b, the oldest, goes
	want := map[string]*backends.Replica{"a": reps[1], "b": nil, "c": reps[0], "d": reps[0]}
	for id, rep := range want {
		if got := s.Lookup(id, now); got != rep {
			t.Errorf("Lookup(%q) = %s, want %s", id, repName(got), repName(rep))
		}
	}
	if st := s.Stats(); st.Entries != 3 || st.Evicted != 1 {
		t.Errorf("stats %+v, want 3 entries, 1 evicted", st)
	}
	// A lower bound drops the least recently bound at once.
	s.SetLimits(1, 0)
	if s.Lookup("d", now) != reps[0] || s.Lookup("a", now) != nil || s.Len() != 1 {
		t.Errorf("after lowering the bound to 1: d %s, a %s, len %d; want d kept alone", repName(s.Lookup("d", now)), repName(s.Lookup("a", now)), s.Len())
	}
}

// An ID over max_id_bytes is never bound, through the table or either
// policy, and is counted; one of exactly max_id_bytes is.
func TestSessionIDsOverBoundNeverBind(t *testing.T) {
	reps := testFleet(t, 3)
	const maxID = 16
	long, exact := strings.Repeat("L", maxID+1), strings.Repeat("E", maxID)
	now := time.Now()

	s := NewSessions(time.Hour)
	s.SetLimits(0, maxID)
	undo := s.Bind(long, reps[0], now)
	undo() // a no-op, not a crash
	if s.Lookup(long, now) != nil || s.Len() != 0 || s.Stats().Rejected != 1 {
		t.Errorf("long id: lookup %s, len %d, stats %+v; want not bound, 1 rejected", repName(s.Lookup(long, now)), s.Len(), s.Stats())
	}
	s.Bind(exact, reps[1], now)
	if s.Lookup(exact, now) != reps[1] {
		t.Errorf("id of exactly max_id_bytes not bound")
	}

	policies := []struct {
		name string
		make func(*Sessions) Policy
	}{
		{"session", func(s *Sessions) Policy { return NewSessionPolicy(s, 0.25) }},
		{"cache_aware", func(s *Sessions) Policy {
			return NewCacheAware(CacheAwareOptions{CacheAwareConfig: CacheAwareConfig{Lambda: 2048, Mu: 4096, Epsilon: 0.25, MinMatchTokens: 256}, Index: index.Options{TTL: time.Minute, BlockSize: 16, DefaultBudget: 1 << 20, MaxBytes: 64 << 20}}, s)
		}},
	}
	for _, pc := range policies {
		t.Run(pc.name, func(t *testing.T) {
			s := NewSessions(time.Hour)
			s.SetLimits(0, maxID)
			p := pc.make(s)
			for range 5 {
				d := p.Pick(&Request{Session: long}, reps)
				if strings.Contains(d.Reason, "session") {
					t.Errorf("long id routed by session: %q", d.Reason)
				}
			}
			if st := s.Stats(); st.Entries != 0 || st.Rejected != 5 {
				t.Errorf("stats %+v after 5 long ids, want 0 entries, 5 rejected", st)
			}
			// Affinity holds for a normal ID.
			first := p.Pick(&Request{Session: exact}, reps)
			for range 5 {
				if d := p.Pick(&Request{Session: exact}, reps); d.Replica != first.Replica || d.Reason != "session" {
					t.Errorf("normal id went to %s (%q), want %s by session", d.Replica.Name(), d.Reason, first.Replica.Name())
				}
			}
		})
	}
}

// The table keeps a digest, not the ID: an ID aliasing a large buffer
// (a request body) does not keep that buffer alive.
func TestSessionBindKeepsNoReferenceToID(t *testing.T) {
	reps := testFleet(t, 1)
	s := NewSessions(time.Hour)
	s.SetLimits(0, 1<<20)
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = 'u'
	}
	freed := make(chan struct{})
	runtime.AddCleanup(&body[0], func(ch chan struct{}) { close(ch) }, freed)
	id := unsafeString(body)
	undo := s.Bind(id, reps[0], time.Now())
	want := strings.Repeat("u", 1<<20)
	// body and id are dead from here: only the table could keep the buffer.
	for range 20 {
		runtime.GC()
		select {
		case <-freed:
			if s.Lookup(want, time.Now()) != reps[0] {
				t.Fatal("binding lost")
			}
			runtime.KeepAlive(undo)
			return
		default:
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Fatal("the buffer the session ID aliased is still reachable after Bind")
}

func unsafeString(b []byte) string { return unsafe.String(&b[0], len(b)) }

// repName names rep for a failure message ("none" for nil).
func repName(rep *backends.Replica) string {
	if rep == nil {
		return "none"
	}
	return rep.Name()
}

// A full table takes at most SessionEntryBytes per binding, map included,
// and stays there as new sessions evict old ones.
func TestSessionEntryBytesBound(t *testing.T) {
	reps := testFleet(t, 2)
	const n = DefaultSessionMaxEntries
	heap := func() int64 { return int64(liveheap.Bytes()) } //nolint:gosec // a heap size
	s := NewSessions(time.Hour)
	now := time.Now()
	before := heap()
	for round := range 3 {
		for i := range n {
			s.Bind("session-"+strconv.Itoa(round)+"-"+strconv.Itoa(i), reps[i%2], now)
		}
		per := (heap() - before) / n
		if st := s.Stats(); st.Entries != n || st.Evicted != int64(round*n) {
			t.Fatalf("round %d: stats %+v", round, st)
		}
		if per > SessionEntryBytes {
			t.Errorf("round %d: %d bytes per binding, want at most %d", round, per, SessionEntryBytes)
		}
		t.Logf("round %d: %d bytes per binding", round, per)
	}
	runtime.KeepAlive(s)
}

// Concurrent binds, undos, lookups, forgets and bound changes keep the
// table within its bound (run with -race).
func TestSessionsConcurrentStayBounded(t *testing.T) {
	reps := testFleet(t, 3)
	s := NewSessions(time.Minute)
	s.SetLimits(64, 0)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 5000 {
				id := "s" + strconv.Itoa(rng.IntN(500))
				rep := reps[rng.IntN(len(reps))]
				switch rng.IntN(10) {
				case 0:
					s.Bind(id, rep, time.Now())()
				case 1:
					s.Forget(rep)
				case 2:
					if i%500 == 0 {
						s.SetLimits(32+rng.IntN(64), 0)
					}
				case 3, 4, 5:
					s.Lookup(id, time.Now())
				default:
					s.Bind(id, rep, time.Now())
				}
				if st := s.Stats(); st.Entries > 96 {
					t.Errorf("%d entries, over every bound set", st.Entries)
					return
				}
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.Entries > st.MaxEntries {
		t.Errorf("%d entries over the bound %d", st.Entries, st.MaxEntries)
	}
}
