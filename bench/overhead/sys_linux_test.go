package overhead

import (
	"os"
	"runtime"
	"slices"
	"strconv"
	"testing"
)

// pinSelf confines every thread, sets GOMAXPROCS, and restore undoes both.
func TestPinSelf(t *testing.T) {
	orig, err := allowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	restore, err := pinSelf(orig[:1], 1)
	if err != nil {
		t.Fatal(err)
	}
	checkThreads(t, orig[:1])
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("GOMAXPROCS %d while pinned, want 1", n)
	}
	restore()
	checkThreads(t, orig)
	if n := runtime.GOMAXPROCS(0); n != procs {
		t.Errorf("GOMAXPROCS %d after restore, want %d", n, procs)
	}
}

func checkThreads(t *testing.T, want []int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		tid, _ := strconv.Atoi(e.Name())
		var m cpuMask
		if err := getAffinity(tid, &m); err != nil {
			continue // exited
		}
		if got := m.cpus(); !slices.Equal(got, want) {
			t.Errorf("thread %d on CPUs %v, want %v", tid, got, want)
		}
	}
}
