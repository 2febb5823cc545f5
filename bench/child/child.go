// Package child runs the benchmarks' peer processes (nginx, HAProxy, a
// kvroute under test): started with their output in a log file, probed
// until ready, stopped with SIGTERM and, after a grace period, SIGKILL. On
// Linux a child is killed when the benchmark dies, so none outlives it.
package child

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a started child process.
type Process struct {
	cmd    *exec.Cmd
	out    *os.File // the child's stdout and stderr
	exited chan struct{}
	once   sync.Once
	stop   error
}

// Start starts argv with its stdout and stderr appended to logPath. env is
// the child's environment; nil inherits this process's.
func Start(argv []string, logPath string, env []string) (*Process, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	// Stop ends the process (SIGTERM, then a kill), not a context.
	cmd := exec.CommandContext(context.Background(), argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = env
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, err
	}
	p := &Process{cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed once the child has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Stop sends SIGTERM, waits up to grace for the child to exit, then kills
// it, which it reports as an error. Later calls return the first result.
func (p *Process) Stop(grace time.Duration) error {
	p.once.Do(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.exited:
			case <-time.After(grace):
				_ = p.cmd.Process.Kill()
				<-p.exited
				p.stop = errors.New("did not stop on SIGTERM; killed")
			}
		}
		_ = p.out.Close()
	})
	return p.stop
}

// WaitReady calls probe every 20 ms until it returns nil, ctx ends, timeout
// passes, or exited (when not nil) is closed.
func WaitReady(ctx context.Context, timeout time.Duration, exited <-chan struct{}, probe func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		last := probe()
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v: %w", timeout, last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-exited:
			return fmt.Errorf("exited before it was ready (last probe: %w)", last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Tail returns the end of the file at path as ": ..." for an error
// message, or "" when it is empty or unreadable.
func Tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return ": " + strings.TrimSpace(string(b))
}
