package runner

import "syscall"

// childAttr makes the kernel kill a child router when the benchmark dies,
// so no nginx or HAProxy outlives it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
