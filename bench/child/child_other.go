//go:build !linux

package child

import "syscall"

// procAttr has nothing to set outside Linux.
func procAttr() *syscall.SysProcAttr { return nil }
