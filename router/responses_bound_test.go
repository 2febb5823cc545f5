package router

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// The Responses table holds at most max_entries ids, each a copy of at
// most MaxResponseIDBytes: a longer id is never recorded, and a recorded
// one does not keep alive the buffer it was read from.
func TestResponsesTableBounded(t *testing.T) {
	reps := testFleet(t, 1)
	tab := NewResponses(time.Hour, 50)
	for i := range 200 {
		tab.Record("resp_"+strconv.Itoa(i), reps[0])
	}
	if tab.Len() != 50 || tab.Lookup("resp_199") != reps[0] || tab.Lookup("resp_0") != nil {
		t.Errorf("len %d, newest %s, oldest %s; want 50, kept, dropped", tab.Len(), repName(tab.Lookup("resp_199")), repName(tab.Lookup("resp_0")))
	}
	long := strings.Repeat("r", MaxResponseIDBytes+1)
	tab.Record(long, reps[0])
	if tab.Lookup(long) != nil || tab.Len() != 50 {
		t.Errorf("an id over %d bytes was recorded", MaxResponseIDBytes)
	}

	buf := make([]byte, 1<<20)
	copy(buf, "resp_from_a_body")
	freed := make(chan struct{})
	runtime.AddCleanup(&buf[0], func(ch chan struct{}) { close(ch) }, freed)
	tab.Record(unsafe.String(&buf[0], MaxResponseIDBytes), reps[0])
	want := string(buf[:MaxResponseIDBytes])
	buf = nil
	for range 20 {
		runtime.GC()
		select {
		case <-freed:
			if tab.Lookup(want) != reps[0] {
				t.Fatal("recorded id lost")
			}
			return
		default:
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Fatal("the buffer a recorded response id was read from is still reachable")
}
