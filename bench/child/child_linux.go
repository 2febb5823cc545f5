package child

import "syscall"

// procAttr makes the kernel kill the child when the benchmark dies.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
