package router

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/liveheap"
)

// benchIDs returns n distinct ids of the form prefix + number.
func benchIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + strconv.Itoa(i)
	}
	return ids
}

// BenchmarkSessions times the session table's hot operations on a full
// table: Lookup of a bound id, Bind of a bound id, and Bind of a new id,
// which drops the least recently bound.
func BenchmarkSessions(b *testing.B) {
	const n = 4096
	reps := testFleet(b, 2)
	ids := benchIDs("session-", 2*n)
	now := time.Unix(1000, 0)
	fill := func() *Sessions {
		s := NewSessions(time.Hour)
		s.SetLimits(n, 0)
		for _, id := range ids[:n] {
			s.Bind(id, reps[0], now)
		}
		return s
	}
	b.Run("lookup", func(b *testing.B) {
		s := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if s.Lookup(ids[i%n], now) == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("rebind", func(b *testing.B) {
		s := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Bind(ids[i%n], reps[i&1], now)
		}
	})
	b.Run("bind-new", func(b *testing.B) {
		s := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Bind(ids[i%len(ids)], reps[0], now)
		}
	})
}

// BenchmarkResponses times the Responses table's hot operations on a full
// table: Lookup of a known id, and Record of a new one, which drops the
// least recently used.
func BenchmarkResponses(b *testing.B) {
	const n = 4096
	reps := testFleet(b, 1)
	ids := benchIDs("resp_", 2*n)
	fill := func() *Responses {
		t := NewResponses(time.Hour, n)
		for _, id := range ids[:n] {
			t.Record(id, reps[0])
		}
		return t
	}
	b.Run("lookup", func(b *testing.B) {
		t := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if t.Lookup(ids[i%n]) == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("record-new", func(b *testing.B) {
		t := fill()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			t.Record(ids[i%len(ids)], reps[0])
		}
	})
}

// TestLRUBytesPerEntry logs the heap one session binding and one
// Responses id binding take, map slot included, against the figures
// SessionEntryBytes and docs/memory.md state.
func TestLRUBytesPerEntry(t *testing.T) {
	const n = 100000
	reps := testFleet(t, 1)
	now := time.Unix(1000, 0)
	ids := benchIDs("session-", n)
	s := NewSessions(time.Hour)
	s.SetLimits(n, 0)
	perSession := liveheap.PerEntry(n, func() {
		for _, id := range ids {
			s.Bind(id, reps[0], now)
		}
	})
	runtime.KeepAlive(s)
	runtime.KeepAlive(ids) // else freed meanwhile, and subtracted
	if perSession > SessionEntryBytes {
		t.Errorf("a session binding takes %.0f B, over SessionEntryBytes %d", perSession, SessionEntryBytes)
	}
	t.Logf("session binding: %.1f B", perSession)

	for _, size := range []int{32, MaxResponseIDBytes} {
		rids := make([]string, n)
		for i := range rids {
			id := "resp_" + strconv.Itoa(i)
			rids[i] = id + strings.Repeat("x", size-len(id))
		}
		tab := NewResponses(time.Hour, n)
		per := liveheap.PerEntry(n, func() {
			for _, id := range rids {
				tab.Record(id, reps[0])
			}
		})
		runtime.KeepAlive(tab)
		runtime.KeepAlive(rids)
		t.Logf("Responses id binding, id of %d B: %.1f B", size, per)
	}
}
