package runner

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

// child is a router running as a child process.
type child struct {
	url    string
	cmd    *exec.Cmd
	out    *os.File // the child's stdout and stderr
	exited chan struct{}
	err    error // Wait's result, set before exited closes
	once   sync.Once
	stop   error
}

// startChild starts bin with args, its output appended to logPath, and
// waits until it answers on url (see waitReady). The child is killed if
// this process dies first (Linux).
func startChild(ctx context.Context, url, logPath, bin string, args ...string) (*child, error) {
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, err
	}
	c := &child{url: url, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if err := waitReady(ctx, url, 10*time.Second, c.exited); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("%s: %w%s", bin, err, tail(logPath))
	}
	return c, nil
}

// URL implements Instance.
func (c *child) URL() string { return c.url }

// Stop implements Instance: SIGTERM (a fast stop for both nginx and
// HAProxy), then SIGKILL after 5 s.
func (c *child) Stop() error {
	c.once.Do(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(5 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.exited
				c.stop = errors.New("did not stop on SIGTERM; killed")
			}
		}
		_ = c.out.Close()
	})
	return c.stop
}

// runCheck runs a configuration check (nginx -t, haproxy -c) and returns
// its output in the error when it fails.
func runCheck(bin string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// tail returns the end of the file at path as ": ..." for an error
// message, or "" when it is empty or unreadable.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return ": " + strings.TrimSpace(string(b))
}
