package overhead

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's CPU times.
const clockTick = 10 * time.Millisecond

// procStat returns a process's parent and its user + system CPU time.
func procStat(pid int) (ppid int, cpu time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces: fields start after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, 0, syscall.EINVAL
	}
	ppid, _ = strconv.Atoi(f[1])
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, time.Duration(utime+stime) * clockTick, nil
}

// treeCPU returns the CPU time of pid and of its direct children (nginx's
// workers), and how many children there are.
func treeCPU(pid int) (time.Duration, int) {
	_, total, err := procStat(pid)
	if err != nil {
		return 0, 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return total, 0
	}
	n := 0
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if ppid, cpu, err := procStat(p); err == nil && ppid == pid {
			total += cpu
			n++
		}
	}
	return total, n
}

// selfCPU returns this process's user + system CPU time.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type cpuMask [16]uint64 // 1024 CPUs

func (m *cpuMask) cpus() []int {
	var out []int
	for i := range len(m) * 64 {
		if m[i/64]&(1<<(i%64)) != 0 {
			out = append(out, i)
		}
	}
	return out
}

func maskOf(cpus []int) cpuMask {
	var m cpuMask
	for _, c := range cpus {
		m[c/64] |= 1 << (c % 64)
	}
	return m
}

func getAffinity(tid int, m *cpuMask) error {
	*m = cpuMask{}
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, uintptr(tid), unsafe.Sizeof(*m), uintptr(unsafe.Pointer(m)))
	if e != 0 {
		return e
	}
	return nil
}

func setAffinity(tid int, m *cpuMask) error {
	_, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(*m), uintptr(unsafe.Pointer(m)))
	if e != 0 {
		return e
	}
	return nil
}

// allowedCPUs lists the CPUs this process may run on.
func allowedCPUs() ([]int, error) {
	var m cpuMask
	if err := getAffinity(0, &m); err != nil {
		return nil, err
	}
	return m.cpus(), nil
}

// pinSelf confines every thread of this process to cpus and sets
// GOMAXPROCS to procs. Threads created later inherit the mask from
// the thread that creates them, so passes repeat until one changes nothing.
// restore undoes both.
func pinSelf(cpus []int, procs int) (restore func(), err error) {
	var orig cpuMask
	if err := getAffinity(0, &orig); err != nil {
		return nil, err
	}
	want := maskOf(cpus)
	if err := setAllThreads(&want); err != nil {
		_ = setAllThreads(&orig)
		return nil, err
	}
	prev := runtime.GOMAXPROCS(procs)
	return func() {
		_ = setAllThreads(&orig)
		if os.Getenv("GOMAXPROCS") == "" {
			runtime.SetDefaultGOMAXPROCS()
		} else {
			runtime.GOMAXPROCS(prev)
		}
	}, nil
}

func setAllThreads(m *cpuMask) error {
	for range 20 {
		ents, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		changed := 0
		for _, e := range ents {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			var cur cpuMask
			if getAffinity(tid, &cur) == nil && cur == *m {
				continue
			}
			if err := setAffinity(tid, m); err != nil && !errors.Is(err, syscall.ESRCH) {
				return err
			}
			changed++
		}
		if changed == 0 {
			return nil
		}
	}
	return nil
}
