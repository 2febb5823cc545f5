//go:build linux

package attack

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// MemSupported reports whether ReadMem can read a process's memory here.
const MemSupported = true

// Mem is a process's resident memory in bytes: now (VmRSS) and at its peak
// since it started (VmHWM).
type Mem struct{ RSS, HWM int64 }

// ReadMem reads VmRSS and VmHWM from /proc/<pid>/status.
func ReadMem(pid int) (Mem, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return Mem{}, err
	}
	defer func() { _ = f.Close() }()
	var m Mem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &m.RSS
		case "VmHWM":
			dst = &m.HWM
		default:
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return Mem{}, err
		}
		*dst = kb << 10
	}
	return m, sc.Err()
}
